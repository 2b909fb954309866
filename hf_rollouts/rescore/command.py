"""``hf-rollouts rescore PATH --verifier SPEC --output OUT``: saved rollouts scored again, written with their card.

The output is PATH's dataset with the new scores (:func:`~.core.rescore_rollouts`), its parquet copy, PATH's
tokenizer folder (when it has one) and PATH's card with a section saying which verifier rescored it, how many
rollouts it rescored, how many it could not score (errors) and the mean reward and solve rate before and after. Exit
code 1 when the new verifier scored no rollout it was given (every one an error), as ``generate`` when every episode
failed.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser

from .core import DEFAULT_PREFIX, spec_text


@dataclass
class RescoreArgs:
    verifier: str = field(
        metadata={
            "help": "The new verifier: a name (exact, numeric, math, ...) or a JSON spec / list of specs, as "
            'env_config["verifier"] takes it, e.g. \'{"name": "judge", "model": "openai:URL#MODEL"}\'.'
        }
    )
    output: str = field(metadata={"help": "Folder to write the rescored dataset to (new or empty)."})
    tokenizer: str | None = field(
        default=None,
        metadata={"help": "Tokenizer bound to the verifiers (TRL's completion_ids); default PATH/tokenizer if there."},
    )
    allow_env_module: list[str] = field(
        default_factory=list,
        metadata={"help": "Module prefix(es) the verifier may import (a trl reward function's module: runs code)."},
    )
    allow_env_model: list[str] = field(
        default_factory=list,
        metadata={"help": "Model/endpoint spec(s) the verifier may load or call (a judge, a reward model)."},
    )
    keep_prefix: str = field(
        default=DEFAULT_PREFIX, metadata={"help": "Prefix of the columns that keep the old scores."}
    )
    batch_size: int = field(default=64, metadata={"help": "Rows per batch (their rollouts are scored together)."})
    split: str = field(default="train", metadata={"help": "Split of a Hub dataset or a DatasetDict folder."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an earlier hf-rollouts output in --output."})


def rescore_parser() -> HfArgumentParser:
    parser = HfArgumentParser([RescoreArgs], prog="hf-rollouts rescore")
    parser.add_argument(
        "path",
        help="Rollout dataset: a folder written by `hf-rollouts generate --output` (or save_to_disk), parquet "
        "file(s) or folder, or a Hub dataset id.",
    )
    return parser


def card_section(summary: dict[str, Any], verifier: str, prefix: str) -> str:
    """The card's section on the rescore."""
    from .. import __version__

    def show(x: float) -> str:
        return "n/a" if x != x else f"{x:.4g}"

    kept = summary["kept"]
    return (
        "\n\n## Rescored\n\n"
        f"The scores of this dataset were computed again, without running the policy, by `hf-rollouts rescore` "
        f"(hf_rollouts {__version__}), with the verifier\n\n```json\n{verifier}\n```\n\n"
        f"| | |\n|---|---|\n| rollouts | {summary['rollouts']} |\n| rescored | {summary['rescored']} |\n"
        f"| errors of the new verifier (status `error`, never a 0) | {summary['errors']} |\n"
        f"| kept as they were (an `error` before any reply was scored) | {kept} |\n"
        f"| mean final reward, before → after | {show(summary['previous_mean_final_reward'])} → "
        f"{show(summary['mean_final_reward'])} |\n"
        f"| solve rate, before → after | {show(summary['previous_solve_rate'])} → {show(summary['solve_rate'])} |\n\n"
        f"`final_rewards`, `padded_per_token_rewards`, `solved`, `infos`, `statuses` and `errors` hold the new scores; "
        f"their earlier values are kept as `{prefix}final_rewards`, `{prefix}padded_per_token_rewards`, ...; "
        "`rescored` says per rollout which ones the new verifier scored. Statistics elsewhere on this card are "
        "those of the run that made the rollouts.\n"
    )


def run_rescore(argv: list[str]) -> int:
    """Rescore PATH into ``--output``; a dataset or spec that cannot be read is one ``error:`` line (exit 2)."""
    args, ns = rescore_parser().parse_args_into_dataclasses(argv)
    from huggingface_hub import DatasetCard

    from ..publish.save import TOKENIZER_DIR, check_output_dir, save_rollouts
    from ..sources import load_dataset_source
    from ..viewer.card import CardHeaderError, read_card_header
    from .core import rescore_rollouts, rescore_summary

    check_output_dir(args.output, overwrite=args.overwrite)  # before any work
    text = args.verifier.strip()
    try:
        verifier = json.loads(text) if text[:1] in "[{" else text
    except json.JSONDecodeError as exc:
        print(f'error: --verifier is a name or a JSON spec, e.g. \'{{"name": "math"}}\' ({exc}).', file=sys.stderr)
        return 2
    try:
        rollouts = load_dataset_source(ns.path, args.split)
    except (FileNotFoundError, ValueError, ConnectionError) as exc:  # ConnectionError: a Hub id, offline
        print(f"error: {ns.path}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    root = Path(ns.path)
    readme = root / "README.md"
    text = readme.read_text() if readme.is_file() else "---\ntags:\n- hf_rollouts\n---\n# Rollouts\n"
    try:  # a stranger's card: aliases, depth and size are refused before huggingface_hub parses it
        read_card_header(text)
    except CardHeaderError as exc:
        print(f"error: {readme}: {exc}; fix or remove the card's YAML header and rescore again.", file=sys.stderr)
        return 2
    tokenizer = None
    tok_path = args.tokenizer or (str(root / TOKENIZER_DIR) if (root / TOKENIZER_DIR).is_dir() else None)
    if tok_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tok_path)
    out = rescore_rollouts(
        rollouts,
        verifier,
        tokenizer=tokenizer,
        allowed_env_modules=args.allow_env_module,
        allowed_env_models=args.allow_env_model,
        keep_prefix=args.keep_prefix,
        batch_size=args.batch_size,
    )
    summary = rescore_summary(out, args.keep_prefix)
    card = DatasetCard(text)
    card.text += card_section(summary, spec_text(verifier), args.keep_prefix)
    target = save_rollouts(out, args.output, card, overwrite=args.overwrite)
    if (root / TOKENIZER_DIR).is_dir():
        shutil.copytree(root / TOKENIZER_DIR, target / TOKENIZER_DIR, dirs_exist_ok=True)
    print(
        f"rescored {summary['rescored']} of {summary['rollouts']} rollouts ({summary['errors']} errors of the new "
        f"verifier, {summary['kept']} kept); mean final reward {summary['previous_mean_final_reward']:.4g} -> "
        f"{summary['mean_final_reward']:.4g}; wrote {target}"
    )
    return 1 if summary["rescored"] and summary["errors"] == summary["rescored"] else 0
