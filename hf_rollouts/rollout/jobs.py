"""What to play: episodes (an env, a task, a rollout index, a seed) and the groups of rollouts of one task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..seeding import derive_seed


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: which env, which task, which rollout, and its sampling seed (``None``: unseeded).

    ``order`` is its place in the run: results come back in that order, and a client-batching agent's batch lists
    its requests in that order."""

    env: Any
    task_data: dict[str, Any]
    session_id: str
    order: int
    seed: int | None = None


@dataclass(frozen=True)
class GroupJob:
    """The rollouts of one task, played as a group: the env's group rewards are computed over them once all have
    ended (:mod:`.group`). ``jobs`` share ``env`` and ``task_data``."""

    env: Any
    task_data: dict[str, Any]
    jobs: tuple[EpisodeJob, ...]


def episode_jobs(
    env: Any,
    task_data_list: list[dict[str, Any]],
    num_rollouts: int,
    *,
    prefix: str = "",
    start: int = 0,
    seed: int | None = None,
) -> list[EpisodeJob]:
    """The ``len(task_data_list) * num_rollouts`` episodes of a trial, task-major.

    With ``seed``, episode ``(t, r)`` gets the seed ``derive_seed(seed, t, r)`` and its turn ``k`` the request
    seed ``derive_seed(that, k)``: a function of the task and rollout only, not of scheduling.
    """
    return [
        EpisodeJob(
            env,
            task,
            f"{prefix}task{t}/rollout{r}",
            start + t * num_rollouts + r,
            None if seed is None else derive_seed(seed, t, r),
        )  # fmt: skip
        for t, task in enumerate(task_data_list)
        for r in range(num_rollouts)
    ]


def task_groups(
    env: Any,
    task_data_list: list[dict[str, Any]],
    num_rollouts: int,
    *,
    prefix: str = "",
    start: int = 0,
    seed: int | None = None,
) -> list[GroupJob]:
    """:func:`episode_jobs`, one :class:`GroupJob` per task."""
    jobs = episode_jobs(env, task_data_list, num_rollouts, prefix=prefix, start=start, seed=seed)
    return [
        GroupJob(env, task, tuple(jobs[t * num_rollouts : (t + 1) * num_rollouts]))
        for t, task in enumerate(task_data_list)
    ]
