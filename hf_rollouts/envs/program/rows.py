"""A dataset's rows as task rows of an agent program (``hf-rollouts tasks --program mypkg.agent:run --from-dataset
...``): each row, all its columns, becomes one task's ``task_data`` (what the program is handed as ``task``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from datasets import Dataset

from ...schema import to_task_dataset
from ..registry import validate_tasks

PROGRAM_ENV = "hf_rollouts.envs.program.ProgramEnv"


def program_task_rows(
    ds: Dataset | list[dict[str, Any]],
    program: str,
    env_config: dict[str, Any] | None = None,
    allowed_env_modules: Iterable[str] = (),
) -> Dataset:
    """Task rows of :class:`~hf_rollouts.envs.program.ProgramEnv` playing ``program`` on every row of ``ds`` (its
    ``task_data``), with ``env_config`` (a ``verifier``, ``isolation``, ...). Checked like any task dataset before
    it is returned: the program's module must be allowed (``allowed_env_modules``, the trust rule), every key valid."""
    config = {**(env_config or {}), "program": program}
    rows = ds.to_list() if isinstance(ds, Dataset) else list(ds)
    tasks = to_task_dataset([{"env_class_path": PROGRAM_ENV, "env_config": config, "task_data": r} for r in rows])
    validate_tasks(tasks, allowed_env_modules)
    return tasks
