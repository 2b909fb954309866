"""Shards expanded on this machine: by this process (``local``), or by each process of a ``torchrun`` /
``accelerate launch`` group (``processes``)."""

from __future__ import annotations

import time

from tqdm.auto import tqdm

from .base import Executor, RunReport, ShardWork


def _expand(work: ShardWork, indices: list[int], report: RunReport, progress: bool, desc: str) -> None:
    """Expand ``indices`` here with the caller's agent, committing each shard as soon as it is done."""
    if not indices:
        return
    runner = work.open_local()
    total = sum(work.episodes(i) for i in indices)
    with tqdm(total=total, desc=desc, unit="episode", disable=not progress) as bar:
        for i in indices:
            work.commit(i, runner(work.plan.shards[i], lambda: bar.update(1)))
            report.expanded.append(i)


class LocalExecutor(Executor):
    """Every pending shard, in order, in this process."""

    name = "local"

    def run(self, work: ShardWork, *, reuse: bool, progress: bool) -> RunReport:
        start = time.perf_counter()
        self.report = report = RunReport(self.name, shards=len(work.plan.shards))
        everything = range(len(work.plan.shards))
        todo = work.plan.pending(everything, reuse)
        report.reused = [i for i in everything if i not in set(todo)]
        _expand(work, todo, report, progress, "rollouts")
        report.wall_s = time.perf_counter() - start
        return report


class ProcessesExecutor(Executor):
    """Process ``p`` of ``N`` (accelerate's process state) expands the pending shards of the ``p``-th contiguous
    block of shards; then every process waits for the others. Blocks are fixed: a process that dies is not
    replaced, and the group fails (use Ray for retries)."""

    name = "processes"

    def run(self, work: ShardWork, *, reuse: bool, progress: bool) -> RunReport:
        from ..distributed import process_state

        start = time.perf_counter()
        state = process_state()
        mine = work.plan.block(state.process_index, state.num_processes)
        self.report = report = RunReport(self.name, shards=len(mine))
        todo = work.plan.pending(mine, reuse)
        report.reused = [i for i in mine if i not in set(todo)]
        multi = state.num_processes > 1
        _expand(work, todo, report, progress, f"rollouts [process {state.process_index}]" if multi else "rollouts")
        state.wait_for_everyone()
        report.wall_s = time.perf_counter() - start
        return report


__all__ = ["LocalExecutor", "ProcessesExecutor"]
