"""Dataset cards for rollout datasets, rendered from ``dataset_cards/rollouts.md``.

The card carries YAML metadata (license, tags, task categories), the environments
and their configs, the agent's model and sampling settings, the seed and
``num_rollouts``, every column's schema, summary statistics
(:mod:`hf_rollouts.publish.stats`) and a snippet that loads the data for training.

Per environment class, a table of its ``env_config`` keys comes from the class's config
declaration (:meth:`hf_rollouts.envs.config.EnvConfig.describe`: key, type, default, help),
with the values this dataset's tasks use. Rendering a card imports no code: a class is
looked up among the modules already imported (the run that generated the data imported
them) or under the trusted ``hf_rollouts.envs``; otherwise the card says it is not shown.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from importlib import resources
from typing import Any

from datasets import Dataset
from huggingface_hub import DatasetCard, DatasetCardData

from .._version import __version__
from ..envs.base import MultistepEnv
from ..envs.registry import class_path, resolve_env_class
from ..provenance.record import CARD_KEY, build_provenance, card_block
from ..schema import COLUMN_HELP, LOGPROB_CONVENTION_KEY, TaskValidationError
from ..task_json import decode_task_value
from .stats import compute_stats

DOCS = "https://hf-rollouts.github.io/hf_rollouts/"
"""The documentation site's address (``site_url`` in mkdocs.yml, ``Documentation`` in pyproject.toml's project URLs;
tests/test_site.py keeps the three equal). A card links absolute addresses: it is read on the Hub, where a path in
this repository leads nowhere."""

REPOSITORY = "https://github.com/hf-rollouts/hf_rollouts"
"""The source repository (``repo_url`` in mkdocs.yml, ``Repository`` in pyproject.toml's project URLs)."""

GUIDES = {
    "training": "guides/training.md",
    "columns": "concepts/rollout-columns.md",
    "reproducibility": "guides/reproducibility.md",
}
"""The docs pages a card links, as paths under ``docs/`` (tests/test_docs.py checks each exists)."""


def page_url(page: str) -> str:
    """The site address of the docs page ``page`` (a path under ``docs/``, e.g. ``guides/training.md``), as mkdocs
    publishes it (one folder per page)."""
    return DOCS + page.removesuffix(".md").removesuffix("index") + ("" if page.endswith("index.md") else "/")


VERIFY_SECTION = "#check-a-rollout-dataset"
"""The anchor of the section "Check a rollout dataset" in the reproducibility guide (tests/test_site.py builds it)."""


MAX_SHOWN_VALUES = 4
"""Distinct values of one key listed in a config table before it says how many there are."""


def _template() -> str:
    return resources.files("hf_rollouts").joinpath("dataset_cards/rollouts.md").read_text(encoding="utf-8")


def _code(text: str, limit: int = 80) -> str:
    """``text`` as a Markdown code span that is safe in a table cell (pipes escaped, one line, shortened)."""
    text = text.replace("\n", " ")
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    text = text.replace("|", "\\|")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "\\|")


def _env_class(path: str) -> type[MultistepEnv] | None:
    """The env class named ``path`` if its module is already imported or trusted; never imports other code."""
    module_name, _, class_name = path.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        try:
            return resolve_env_class(path)  # imports only modules under the trusted hf_rollouts.envs
        except TaskValidationError:
            return None
    cls = getattr(module, class_name, None)
    return cls if isinstance(cls, type) and issubclass(cls, MultistepEnv) else None


def _used(configs: list[dict[str, Any]], key: str) -> str:
    """The values ``configs`` give ``key``, as a cell: distinct JSON values, and *default* where it is not set."""
    values = list(dict.fromkeys(json.dumps(c[key], sort_keys=True) for c in configs if key in c))
    shown = [_code(v, 40) for v in values[:MAX_SHOWN_VALUES]]
    if len(values) > MAX_SHOWN_VALUES:
        shown.append(f"… ({len(values)} values)")
    if any(key not in c for c in configs):
        shown.append("*default*")
    return ", ".join(shown)


def env_config_tables(env_configs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per env class path in ``env_configs`` (one ``(env_class_path, env_config)`` per distinct config),
    the rows of its config table: each declared key's type, default and help
    (:meth:`~hf_rollouts.envs.config.EnvConfig.describe`) and the values used; then any undeclared key
    the configs hold. ``rows`` is ``None`` when the class is not available (see the module docstring)."""
    by_path: dict[str, list[dict[str, Any]]] = {}
    for path, config in env_configs:
        by_path.setdefault(path, []).append(config)
    tables = []
    for path, configs in sorted(by_path.items()):
        cls = _env_class(path)
        table: dict[str, Any] = {"path": path, "name": path.rsplit(".", 1)[-1], "config_class": None, "rows": None}
        if cls is not None:
            config_class = cls.config_class
            table["config_class"] = class_path(config_class)
            table["rows"] = [
                {
                    "key": _code(row["key"]),
                    "type": _cell(row["type"]),
                    "default": _code(row["default"], 40),
                    "used": _used(configs, row["key"]),
                    "help": _cell(row["help"]),
                }
                for row in config_class.describe()
            ]
            declared = set(config_class.keys())
            undeclared = sorted({k for c in configs for k in c if k not in declared})
            passed_on = "passed on by the environment" if config_class.extra_keys_allowed else "ignored (not declared)"
            table["rows"] += [
                {"key": _code(k), "type": "", "default": "", "used": _used(configs, k), "help": passed_on}
                for k in undeclared
            ]
        tables.append(table)
    return tables


def _solved_rule(path: str, config: dict[str, Any]) -> str:
    """What counts as solved for one env class and config, as the card says it."""
    top = config.get("max_reward", getattr(_env_class(path), "default_max_reward", None))
    if isinstance(top, (int, float)) and not isinstance(top, bool):
        return f"its `info['solved']` where it says, else final reward >= {top:g}"
    return "its `info['solved']` only (no max_reward declared)"


def provenance_rows(provenance: dict[str, Any]) -> list[tuple[str, str]]:
    """The card's *Provenance* table: one ``(what, value)`` per recorded fact; empty without a run record."""
    run = provenance.get("run")
    if not run:
        return []
    agent, tok = run.get("agent") or {}, run.get("tokenizer") or {}
    rows = [
        ("hf_rollouts", _code(str(run.get("hf_rollouts")))),
        ("agent", _code(f"{agent.get('model')} ({agent.get('class')})")),
        ("revision", _code(str(agent.get("revision") or "not known"))),
        ("weights probe", _code(str(agent.get("weights_probe")))),
        ("dtype, backend", _code(f"{agent.get('dtype')}, {agent.get('backend')}")),
        ("sampling", _code(json.dumps(agent.get("sampling"), sort_keys=True), 200)),
        ("log-prob convention", _code(json.dumps(agent.get("logprob_convention"), sort_keys=True))),
        ("chat template", _code(f"{tok.get('chat_template_family')}, sha256 {str(tok.get('chat_template_sha256'))}")),
        ("tokenizer fingerprint", _code(str(tok.get("fingerprint")))),
    ]
    for env in run.get("envs", []):
        sources = ", ".join(f"{m} {h[:12]}" for m, h in sorted((env.get("source_files") or {}).items()))
        rows.append(
            (
                f"env {_code(env['class'].rsplit('.', 1)[-1])}",
                _cell(f"config {_code(json.dumps(env.get('config'), sort_keys=True), 120)}; sources {sources}"),
            )
        )  # noqa: E501
    for v in provenance.get("verifiers", []):
        note = "" if v.get("replayable") else f" (not replayable: {v.get('why')})"
        rows.append((f"verifier of {_code(v['env'].rsplit('.', 1)[-1])}", _code(json.dumps(v["specs"]), 160) + note))
    seeds = run.get("seeds") or {}
    rows.append(("seeds", _cell(f"run seed {seeds.get('run_seed')}; {seeds.get('rule')}")))
    shards, data = run.get("shards") or {}, provenance.get("data") or {}
    rows.append(("run fingerprint", _code(str(run.get("run_fingerprint")))))
    rows.append(
        (
            "shards",
            f"{shards.get('num_shards')} of {shards.get('shard_size')} task rows; {len(data.get('shards', []))} "
            f"digests of {data.get('shard_size')} rows each in the YAML block",
        )
    )
    return rows


def render_card(
    ds: Dataset,
    *,
    agent_info: dict[str, Any],
    seed: int,
    pad_token_id: int,
    load_path: str = "path/or/repo_id",
    pretty_name: str | None = None,
    license: str = "apache-2.0",
    run_options: dict[str, Any] | None = None,
    executor_report: Any = None,
    provenance: dict[str, Any] | None = None,
) -> DatasetCard:
    """Render the card of rollout dataset ``ds`` (use ``card.save(path)`` or ``card.push_to_hub(repo_id)``).

    ``run_options``: the run's other settings (:class:`~hf_rollouts.pipeline.RolloutOptions` as a dict, e.g.
    ``batch_size``, ``env_workers``, time limits), shown beside the seed. ``executor_report``: what the executor did
    (:class:`~hf_rollouts.executors.RunReport`: shards run, reused, retried), shown in a section of its own.
    ``provenance``: the dataset's :func:`~hf_rollouts.provenance.build_provenance` (default: built from ``ds``), put
    in the YAML metadata (:data:`~hf_rollouts.provenance.CARD_KEY`, without per-row hashes) and summed up in the
    *Provenance* section (:func:`provenance_rows`)."""
    stats = compute_stats(ds)
    provenance = provenance if provenance is not None else build_provenance(ds)
    configs: Counter[tuple[str, str]] = Counter(
        (p, json.dumps(decode_task_value(c), sort_keys=True)) for p, c in zip(ds["env_class_path"], ds["env_config"])
    )
    env_names = sorted({p.rsplit(".", 1)[-1] for p, _ in configs})
    card_data = DatasetCardData(
        license=license,
        pretty_name=pretty_name or f"hf_rollouts: {', '.join(env_names)}",
        task_categories=["reinforcement-learning", "text-generation"],
        tags=["hf_rollouts", "rl", "multi-turn", "rollouts", "grpo", *[n.lower() for n in env_names]],
        size_categories="n<1K" if len(ds) < 1000 else "1K<n<10K" if len(ds) < 10000 else "10K<n<100K",
        **({LOGPROB_CONVENTION_KEY: agent_info["logprob_convention"]} if agent_info.get("logprob_convention") else {}),
        **{CARD_KEY: card_block(provenance)},
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
        environments=[{"path": p, "config": _code(c, 200), "tasks": n} for (p, c), n in sorted(configs.items())],
        env_configs=env_config_tables([(p, json.loads(c)) for p, c in sorted(configs)]),
        agent={k: json.dumps(v) if not isinstance(v, str) else v for k, v in agent_info.items()},
        seed=seed,
        run_options={k: json.dumps(v) for k, v in (run_options or {}).items() if k not in ("seed", "num_rollouts")},
        stats=stats,
        stats_table=stats.table(),
        solved_rules=[
            {"name": name, "rule": rule}
            for name, rule in dict.fromkeys(
                (p.rsplit(".", 1)[-1], _solved_rule(p, json.loads(c))) for p, c in sorted(configs)
            )
        ],
        provenance=provenance_rows(provenance),
        executor=[(k, _cell(v)) for k, v in executor_report.rows()] if executor_report is not None else None,
        columns=[
            {"name": n, "type": repr(f).replace("|", "\\|"), "help": COLUMN_HELP.get(n, "")}
            for n, f in ds.features.items()
        ],
        load_path=load_path,
        pad_token_id=pad_token_id,
        plain_load=plain,
        guides={name: page_url(page) for name, page in GUIDES.items()},
        verify_guide=page_url(GUIDES["reproducibility"]) + VERIFY_SECTION,
        docs=DOCS,
        repository=REPOSITORY,
    )
