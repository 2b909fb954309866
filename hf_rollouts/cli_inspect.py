"""``hf-rollouts inspect PATH``: a rollout dataset's statistics and one trajectory (the best one with ``--best``)."""

from __future__ import annotations

import math
from pathlib import Path

from transformers import HfArgumentParser

from .cli_options import InspectArgs, UsageError

__all__ = ["best_rollout", "cmd_inspect", "inspect_parser"]


def inspect_parser() -> HfArgumentParser:
    parser = HfArgumentParser([InspectArgs], prog="hf-rollouts inspect")
    parser.add_argument("path", help="Rollout dataset directory written by `hf-rollouts generate`.")
    return parser


def cmd_inspect(argv: list[str]) -> int:
    args, ns = inspect_parser().parse_args_into_dataclasses(argv)
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from .publish import compute_stats, format_trajectory

    root = Path(ns.path)
    if not (root / "state.json").is_file():
        raise UsageError(f"{root} is not a rollout dataset directory (no state.json); point at `generate --output`.")
    ds = load_from_disk(str(root))
    if args.best:
        args.row, args.rollout = best_rollout(ds["final_rewards"], ds["statuses"])
    if not 0 <= args.row < len(ds):
        raise UsageError(f"--row {args.row} is out of range; the dataset has {len(ds)} rows.")
    row = ds[args.row]
    if not 0 <= args.rollout < len(row["final_rewards"]):
        raise UsageError(
            f"--rollout {args.rollout} is out of range; row {args.row} has {len(row['final_rewards'])} rollouts."
        )
    tok_path = args.tokenizer or (str(root / "tokenizer") if (root / "tokenizer").is_dir() else None)
    tokenizer = AutoTokenizer.from_pretrained(tok_path) if tok_path else None
    print("=== summary")
    for key, value in compute_stats(ds).table():
        print(f"  {key:<22} {value}")
    print(f"=== row {args.row}, rollout {args.rollout}")
    print(format_trajectory(row, args.rollout, tokenizer))
    return 0


def best_rollout(final_rewards: list[list[float]], statuses: list[list[str]]) -> tuple[int, int]:
    """``(row, rollout)`` of the first rollout with the highest final reward among those that are not errors
    (``(0, 0)`` when every rollout is an error)."""
    best, where = -math.inf, (0, 0)
    for r, (rewards, states) in enumerate(zip(final_rewards, statuses)):
        for k, (reward, status) in enumerate(zip(rewards, states)):
            if status != "error" and reward is not None and math.isfinite(reward) and reward > best:
                best, where = reward, (r, k)
    return where
