"""The task rows of a training run: :func:`task_splits` (train rows and held-out rows, from files or an env)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset

from ..envs import get_env_class
from ..sources import load_tasks


def task_splits(
    tokenizer: Any,
    *,
    env: str | None = None,
    env_config: dict[str, Any] | None = None,
    tasks: str | Path | Dataset | None = None,
    eval_tasks: str | Path | Dataset | None = None,
    num_train: int = 0,
    num_eval: int = 0,
) -> tuple[Dataset | None, Dataset | None]:
    """``(train rows, held-out rows)`` of a training run. Train rows: ``tasks`` (a task-row dataset or file,
    :func:`hf_rollouts.sources.load_tasks`) or ``num_train`` rows of ``env``'s train split (``None`` for 0). Held-out
    rows: the first ``num_eval`` of ``eval_tasks`` or of ``env``'s eval split (``None`` for 0). ``env`` (a registered
    name or class path, built with ``env_config``) is needed only for what the files do not give."""
    built = None
    if (tasks is None and num_train) or (eval_tasks is None and num_eval):
        if env is None:
            raise ValueError("task_splits needs env= (a registered env name) or task rows (tasks=, eval_tasks=).")
        built = get_env_class(env)(tokenizer, env_config or {})
    train = load_tasks(tasks) if tasks is not None else built.get_train_dataset(num_train) if num_train else None
    held = None
    if num_eval:
        held = load_tasks(eval_tasks) if eval_tasks is not None else built.get_eval_dataset(num_eval)
        held = held.select(range(min(num_eval, len(held))))
    return train, held


__all__ = ["task_splits"]
