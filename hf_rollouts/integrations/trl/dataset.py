"""The trainer's dataset: task rows plus a ``prompt`` column that encodes each row (and back)."""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset

from ...envs.registry import validate_tasks
from ...schema import TASK_COLUMNS, TaskValidationError, decode_task_row

PROMPT_KEY = "hf_rollouts_task"
"""Key of the row index inside a :func:`to_trl_dataset` prompt."""


def to_trl_dataset(
    tasks: Dataset, *, allowed_env_modules: tuple[str, ...] = (), allowed_env_models: tuple[str, ...] = ()
) -> Dataset:
    """``tasks`` plus a ``prompt`` column for ``GRPOTrainer``: the task row as JSON, with its index.

    Every row's prompt is distinct (the index is part of it), even for identical task data, and
    the rollout function rebuilds the task row from the prompt alone, so the same function serves
    train and eval datasets. The rows are checked first (:func:`~hf_rollouts.envs.registry.validate_tasks`,
    errors name the row and field); pass the same ``allowed_env_*`` as to ``make_rollout_func``.
    """
    if "prompt" in tasks.column_names:
        raise TaskValidationError(
            "the task dataset already has a 'prompt' column; to_trl_dataset adds its own. Remove or rename it "
            "(tasks.remove_columns('prompt'))."
        )
    validate_tasks(tasks, allowed_env_modules, allowed_env_models)
    rows = tasks.select_columns(list(TASK_COLUMNS))
    prompts = [  # the dicts exactly: json writes a float's shortest repr and integers of any size
        json.dumps({PROMPT_KEY: i, **decode_task_row(row, f"row {i}")}, sort_keys=True) for i, row in enumerate(rows)
    ]
    return tasks.add_column("prompt", prompts)


def task_from_prompt(prompt: Any, where: str = "prompt") -> tuple[int, dict[str, Any]]:
    """``(row index, task row)`` encoded in a :func:`to_trl_dataset` prompt; a clear error otherwise."""
    try:
        data = json.loads(prompt) if isinstance(prompt, str) else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or PROMPT_KEY not in data or any(c not in data for c in TASK_COLUMNS):
        raise TaskValidationError(
            f"{where} is not a task prompt from hf_rollouts.integrations.trl.to_trl_dataset: {str(prompt)[:120]!r}. "
            "Build the trainer's dataset with to_trl_dataset(tasks)."
        )
    return int(data[PROMPT_KEY]), {c: data[c] for c in TASK_COLUMNS}
