"""Shards expanded on this machine: by this process (``local``), or by each process of a ``torchrun`` /
``accelerate launch`` group (``processes``)."""

from __future__ import annotations

from collections.abc import Sequence

from .base import Executor, ShardPlan, ShardTask


class LocalExecutor(Executor):
    """Every pending shard, in order, in this process (with the caller's agent)."""

    name = "local"

    def expand(self, task: ShardTask, todo: list[int]) -> None:
        for i in todo:
            self.commit(task, i, task.expand(i, self.episode_done(i)))


class ProcessesExecutor(LocalExecutor):
    """Process ``p`` of ``N`` (accelerate's process state) expands the pending shards of the ``p``-th contiguous
    block of shards; then every process waits for the others. Blocks are fixed: a process that dies is not
    replaced, and the group fails (use Ray for retries)."""

    name = "processes"

    def shards(self, plan: ShardPlan) -> Sequence[int]:
        from ..distributed import process_state

        self.state = process_state()
        return plan.block(self.state.process_index, self.state.num_processes)

    def progress_label(self) -> str:
        multi = self.state.num_processes > 1
        return f"rollouts [process {self.state.process_index}]" if multi else "rollouts"

    def finish(self) -> None:
        self.state.wait_for_everyone()


__all__ = ["LocalExecutor", "ProcessesExecutor"]
