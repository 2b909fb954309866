"""Checks of one row's ``task_data``, for an env's ``validate_task_data`` hook.

:meth:`~hf_rollouts.envs.base.MultistepEnv.validate_task_data` looks at a row's ``task_data`` without playing it
and raises :class:`TaskDataError` naming the key that is wrong. ``generate_rollouts``, ``rollout_map`` and the CLI
call it for every row before any episode runs (:func:`hf_rollouts.expansion.prepare_rows`), and report a
:class:`~hf_rollouts.schema.TaskValidationError` naming the row and the key. Values are checked strictly, as
``env_config`` values are (:mod:`hf_rollouts.envs.config`): ``"7"`` or ``7.0`` is not an int, ``True`` is not a
number.
"""

from __future__ import annotations

import numbers
from typing import Any


class TaskDataError(ValueError):
    """A ``task_data`` value is missing or wrong; ``key`` names it (``None``: the whole ``task_data``)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(message)
        self.key = key


def require(task_data: Any, key: str, env: str, hint: str = "") -> Any:
    """``task_data[key]``; :class:`TaskDataError` when ``task_data`` is not a dict or has no ``key``."""
    if not isinstance(task_data, dict):
        raise TaskDataError(None, f"{env} task_data must be a dict, got {type(task_data).__name__}.")
    if key not in task_data:
        raise TaskDataError(key, f"{env} task_data needs {key!r}{hint}; it has keys {sorted(task_data)}.")
    return task_data[key]


def task_int(
    task_data: Any, key: str, env: str, *, low: int | None = None, high: int | None = None, hint: str = ""
) -> int:
    """``task_data[key]`` as an int (no bool, str or float) in ``[low, high]``; :class:`TaskDataError` otherwise."""
    value = require(task_data, key, env, hint)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TaskDataError(key, f"{env} task_data[{key!r}] must be an int, got {type(value).__name__} {value!r:.80}.")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{'' if low is None else f'{low} <= '}{key}{'' if high is None else f' <= {high}'}"
        raise TaskDataError(key, f"{env} task_data[{key!r}] = {value} is out of range: it needs {bounds}.")
    return int(value)


__all__ = ["TaskDataError", "require", "task_int"]
