"""Where a run's shards are expanded: one plan, several places to run it (datatrove's executors).

* :mod:`.base` — :func:`plan_shards` (the one planning function), the :class:`ShardTask` contract, the
  :class:`Executor` base (pending, reused, retried, commits, progress and the :class:`RunReport`),
  :class:`ExecutorOptions`;
* :mod:`.local` — :class:`LocalExecutor` (this process) and :class:`ProcessesExecutor` (a ``torchrun`` /
  ``accelerate launch`` group, a fixed block of shards per process);
* :mod:`.ray_executor` — :class:`RayExecutor` (Ray workers, retries, a per-shard deadline; ``ray`` imported
  only when it runs).

Executors know nothing of rollouts: :mod:`hf_rollouts.pipeline` gives them the work
(:class:`hf_rollouts.shard_task.RolloutShardTask`).
"""

from __future__ import annotations

from .base import (
    EXECUTORS,
    Executor,
    ExecutorOptions,
    RunReport,
    ShardFailedError,
    ShardPlan,
    ShardTask,
    plan_shards,
)
from .local import LocalExecutor, ProcessesExecutor
from .ray_executor import RayExecutor


def make_executor(options: ExecutorOptions) -> Executor:
    """The executor that ``options`` name (``auto``: ``processes`` under a multi-process launch, else ``local``)."""
    name = options.executor
    if name == "auto":
        from ..distributed import process_state

        name = "processes" if process_state().num_processes > 1 else "local"
    if name == "local":
        return LocalExecutor()
    if name == "processes":
        return ProcessesExecutor()
    return RayExecutor(
        options.ray_address,
        num_workers=options.num_workers,
        gpus_per_worker=options.gpus_per_worker,
        cpus_per_worker=options.cpus_per_worker,
        shard_timeout=options.shard_timeout,
        max_shard_retries=options.max_shard_retries,
    )


__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorOptions",
    "LocalExecutor",
    "ProcessesExecutor",
    "RayExecutor",
    "RunReport",
    "ShardFailedError",
    "ShardPlan",
    "ShardTask",
    "make_executor",
    "plan_shards",
]
