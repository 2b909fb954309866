"""Dataset cards for rollout datasets, rendered from ``dataset_cards/rollouts.md``.

The card carries YAML metadata (license, tags, task categories), the environments
and their configs, the agent's model and sampling settings, the seed and
``num_rollouts``, every column's schema, summary statistics
(:mod:`hf_rollouts.publish.stats`) and a snippet that loads the data for training.
"""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources
from typing import Any

from datasets import Dataset
from huggingface_hub import DatasetCard, DatasetCardData

from .._version import __version__
from ..schema import COLUMN_HELP, LOGPROB_CONVENTION_KEY
from .stats import compute_stats


def _template() -> str:
    return resources.files("hf_rollouts").joinpath("dataset_cards/rollouts.md").read_text(encoding="utf-8")


def render_card(
    ds: Dataset,
    *,
    agent_info: dict[str, Any],
    seed: int,
    pad_token_id: int,
    load_path: str = "path/or/repo_id",
    pretty_name: str | None = None,
    license: str = "apache-2.0",
) -> DatasetCard:
    """Render the card of rollout dataset ``ds`` (use ``card.save(path)`` or ``card.push_to_hub(repo_id)``)."""
    stats = compute_stats(ds)
    configs: Counter[tuple[str, str]] = Counter(
        (p, json.dumps(c, sort_keys=True)) for p, c in zip(ds["env_class_path"], ds["env_config"])
    )
    env_names = sorted({p.rsplit(".", 1)[-1] for p, _ in configs})
    card_data = DatasetCardData(
        license=license,
        pretty_name=pretty_name or f"hf_rollouts: {', '.join(env_names)}",
        task_categories=["reinforcement-learning", "text-generation"],
        tags=["hf_rollouts", "rl", "multi-turn", "rollouts", "grpo", *[n.lower() for n in env_names]],
        size_categories="n<1K" if len(ds) < 1000 else "1K<n<10K" if len(ds) < 10000 else "10K<n<100K",
        **({LOGPROB_CONVENTION_KEY: agent_info["logprob_convention"]} if agent_info.get("logprob_convention") else {}),
    )
    is_hub = not (load_path.startswith("/") or load_path.startswith("."))
    plain = (
        f'from datasets import load_dataset\nds = load_dataset("{load_path}", split="train")'
        if is_hub
        else f'from datasets import load_from_disk\nds = load_from_disk("{load_path}")'
    )
    return DatasetCard.from_template(
        card_data,
        template_str=_template(),
        pretty_name=card_data.pretty_name,
        version=__version__,
        environments=[{"path": p, "config": c, "tasks": n} for (p, c), n in sorted(configs.items())],
        agent={k: json.dumps(v) if not isinstance(v, str) else v for k, v in agent_info.items()},
        seed=seed,
        stats=stats,
        stats_table=stats.table(),
        columns=[
            {"name": n, "type": repr(f).replace("|", "\\|"), "help": COLUMN_HELP.get(n, "")}
            for n, f in ds.features.items()
        ],
        load_path=load_path,
        pad_token_id=pad_token_id,
        plain_load=plain,
    )
