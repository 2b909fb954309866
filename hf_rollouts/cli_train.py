"""``hf-rollouts train CONFIG [--flag value ...] [--dry-run]``: the GRPO run of
:func:`hf_rollouts.recipes.train.train`, driven by a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file.

The file's keys are :class:`~hf_rollouts.recipes.train_config.TrainConfig`'s fields (the flags of
``scripts/train_grpo.py``; ``lr`` or ``tasks-per-iter`` spelled with ``_`` or ``-``); flags on the command line win
over the file. An unknown key, or a value of the wrong type, is an error naming the key and the file (and the
nearest known key), before any work. ``--dry-run`` checks the config, the task rows (the trust rule of
:func:`hf_rollouts.envs.registry.validate_tasks` included), the model and the memory plan
(:mod:`hf_rollouts.recipes.plan`), prints the plan and exits: exit code 0 when the run can start, 2 when it cannot.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import HfArgumentParser


class ConfigFileError(ValueError):
    """A config file that cannot be read, or a key or value in it that is not an option (names the key and file)."""


@dataclass
class TrainCommandArgs:
    dry_run: bool = field(
        default=False,
        metadata={"help": "Check the config, task rows, model and memory plan, print the plan and exit (no run)."},
    )


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The file's mapping of options (YAML or TOML by its suffix); keys with ``-`` become ``_``."""
    import tomllib
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigFileError(f"{path}: no such config file (give a .yaml, .yml or .toml file of train options).")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigFileError(f"{path}: a config file ends in .yaml, .yml or .toml, not {path.suffix!r}.")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigFileError(f"{path}: does not parse: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: must be a mapping of option: value, got {type(data).__name__}.")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _accepts(hint: Any, value: Any) -> bool:
    args = typing.get_args(hint)
    if args:  # X | None
        return any(_accepts(a, value) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def check_config_values(values: dict[str, Any], cls: type, path: str | Path) -> dict[str, Any]:
    """``values`` checked against ``cls``'s fields: :class:`ConfigFileError` for an unknown key (with the nearest
    known one) or a value of another type, naming the key and ``path``."""
    hints, names = typing.get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]
    for key, value in values.items():
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else "; the keys are the flags of `hf-rollouts train --help`"
            raise ConfigFileError(f"{path}: unknown key {key!r}{hint}.")
        if not _accepts(hints[key], value):
            raise ConfigFileError(f"{path}: {key} must be {hints[key]}, got {value!r}.".replace("typing.", ""))
    return values


def train_parser() -> HfArgumentParser:
    from .recipes.train_config import TrainConfig

    parser = HfArgumentParser([TrainConfig, TrainCommandArgs], prog="hf-rollouts train")
    parser.add_argument("config", help="A YAML (.yaml, .yml) or TOML (.toml) file of these options; flags win.")
    return parser


def parse_train_args(argv: list[str]) -> tuple[Any, TrainCommandArgs]:
    """``(TrainConfig, TrainCommandArgs)``: the file named first (or anywhere) on the command line, then the flags."""
    from .recipes.train_config import TrainConfig

    parser = train_parser()
    first, _ = parser.parse_known_args(argv)  # where the config file is
    parser.set_defaults(**check_config_values(read_config_file(first.config), TrainConfig, first.config))
    cfg, args, _ns = parser.parse_args_into_dataclasses(argv)
    return cfg, args


def run_train(argv: list[str]) -> int:
    """The command: exit code 2 (one ``error:`` line) for a config that cannot run, 0 after the run or a dry run
    that found nothing wrong."""
    from .recipes.plan import plan_run
    from .recipes.train import train
    from .recipes.train_config import TrainConfigError, check_config

    if any(a in ("-h", "--help") for a in argv):
        train_parser().print_help()
        return 0
    try:
        cfg, args = parse_train_args(argv)
        check_config(cfg)
    except (ConfigFileError, TrainConfigError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    import datasets
    import transformers

    datasets.disable_progress_bars()  # the table (or the plan) is the command's output
    transformers.utils.logging.disable_progress_bar()
    if args.dry_run:
        plan = plan_run(cfg)
        print(plan.describe())
        return 0 if plan.ok else 2
    try:
        train(cfg, command=shlex.join(["hf-rollouts", "train", *argv]))
    except TrainConfigError as exc:  # e.g. --resume without a checkpoint
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


__all__ = ["ConfigFileError", "TrainCommandArgs", "check_config_values", "parse_train_args", "read_config_file",
           "run_train", "train_parser"]  # fmt: skip
