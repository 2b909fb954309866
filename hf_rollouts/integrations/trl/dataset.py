"""The trainer's dataset: task rows plus a ``prompt`` column that encodes each row (and back)."""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset

from ...envs.registry import validate_tasks
from ...schema import TASK_COLUMNS, TaskValidationError, decode_task_row

PROMPT_KEY = "hf_rollouts_task"
"""Key of the row index inside a :func:`to_trl_dataset` prompt."""

ONE_SAMPLE = (
    "GRPOTrainer's rollout_func returns one completion per prompt, so an episode must be one sample (one token "
    "sequence); an episode of several samples (env_config['template_mode'] = 'render', or a program whose history is "
    "not an extension) would lose all but its last. Play it with env_config['template_mode'] = 'append', or train "
    "it with hf_rollouts.training.prepare_rollouts + grpo_update, which trains every sample with its episode's "
    "advantage."
)
"""Why the TRL bridge refuses episodes of several samples (:class:`~hf_rollouts.sample.Sample`), and what to do."""


def refuse_render_mode(env_config: Any, where: str) -> None:
    """Raise :class:`TaskValidationError` naming ``where`` when ``env_config`` asks for ``template_mode: "render"``
    (its episodes may be several samples, which a TRL row cannot hold: :data:`ONE_SAMPLE`)."""
    if isinstance(env_config, dict) and env_config.get("template_mode", "append") != "append":
        raise TaskValidationError(
            f"{where}: env_config['template_mode'] = {env_config['template_mode']!r}: {ONE_SAMPLE}"
        )


def to_trl_dataset(
    tasks: Dataset, *, allowed_env_modules: tuple[str, ...] = (), allowed_env_models: tuple[str, ...] = ()
) -> Dataset:
    """``tasks`` plus a ``prompt`` column for ``GRPOTrainer``: the task row as JSON, with its index.

    Every row's prompt is distinct (the index is part of it), even for identical task data, and
    the rollout function rebuilds the task row from the prompt alone, so the same function serves
    train and eval datasets. The rows are checked first (:func:`~hf_rollouts.envs.registry.validate_tasks`,
    errors name the row and field); pass the same ``allowed_env_*`` as to ``make_rollout_func``. A row whose env
    plays ``template_mode: "render"`` is refused (:data:`ONE_SAMPLE`).
    """
    if "prompt" in tasks.column_names:
        raise TaskValidationError(
            "the task dataset already has a 'prompt' column; to_trl_dataset adds its own. Remove or rename it "
            "(tasks.remove_columns('prompt'))."
        )
    validate_tasks(tasks, allowed_env_modules, allowed_env_models)
    rows = [decode_task_row(row, f"row {i}") for i, row in enumerate(tasks.select_columns(list(TASK_COLUMNS)))]
    for i, row in enumerate(rows):
        refuse_render_mode(row["env_config"], f"row {i}")
    # the dicts exactly: json writes a float's shortest repr and integers of any size
    prompts = [json.dumps({PROMPT_KEY: i, **row}, sort_keys=True) for i, row in enumerate(rows)]
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
