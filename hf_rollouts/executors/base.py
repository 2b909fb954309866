"""What every executor shares: the run's shard plan, the work contract, the options, the report.

A run is planned once (:func:`plan_shards`): fixed contiguous shards of the task rows, each with the cache
file it is written to (:class:`~hf_rollouts.shard_cache.ShardFile`). Executors only decide *where* the
pending shards are expanded (this process, a block per process of an ``accelerate`` group, Ray workers);
the plan, the seeds, the file names and the final read are the same for all of them, so a run may start
with one executor and finish with another from the same cache folder.

The work itself is opaque to executors (:class:`ShardTask`, one picklable object): expand shard ``i`` into its
rollout columns (an Arrow table) wherever it runs, then commit it (the driver assembles the task columns and
writes the file). Only the process that called the executor commits, so shard files have one writer. The
bookkeeping around it (pending, reused, retried, committed, the progress bar and the :class:`RunReport`) is the
:class:`Executor` base's; an executor only says where the pending shards run.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import pyarrow as pa
from tqdm.auto import tqdm

from ..shard_cache import ShardFile

EXECUTORS = ("auto", "local", "processes", "ray")


class ShardFailedError(RuntimeError):
    """A shard could not be expanded: its worker kept dying or running past the deadline, or the work raised."""


@dataclass(frozen=True)
class ShardPlan:
    """The shards of one run, in task order (shard ``i`` holds task rows ``[i * shard_size, ...)``)."""

    shards: tuple[ShardFile, ...]

    def block(self, rank: int, world: int) -> range:
        """The contiguous block of shard indices that process ``rank`` of ``world`` owns (``processes``)."""
        per = math.ceil(len(self.shards) / world)
        return range(rank * per, min(len(self.shards), (rank + 1) * per))

    def pending(self, indices: Sequence[int] | range, reuse: bool) -> list[int]:
        """``indices`` less the shards whose file exists and checks out (datatrove's *skip completed*).

        With ``reuse=False`` every shard is pending. A file that does not check out is reported (a warning
        naming it) and redone."""
        return [i for i in indices if not (reuse and self.shards[i].reusable())]

    def rows(self, index: int) -> int:
        shard = self.shards[index]
        return shard.stop - shard.start


def plan_shards(cache_dir: str | Path, fingerprint: str, num_tasks: int, shard_size: int) -> ShardPlan:
    """The one planning function: ``ceil(num_tasks / shard_size)`` shards of the run ``fingerprint``, each the file
    ``<cache_dir>/<fingerprint>-shard<i>-of<n>.arrow`` holding task rows ``[i * shard_size, min(num_tasks, ...))``."""
    cache = Path(cache_dir)
    num_shards = max(1, math.ceil(num_tasks / shard_size))
    return ShardPlan(
        tuple(
            ShardFile(
                cache / f"{fingerprint}-shard{i:05d}-of{num_shards:05d}.arrow",
                fingerprint,
                i,
                num_shards,
                i * shard_size,
                min(num_tasks, (i + 1) * shard_size),
            )
            for i in range(num_shards)
        )
    )


class ShardTask(Protocol):
    """A run's shard work as executors see it (:class:`hf_rollouts.shard_task.RolloutShardTask`): one object that
    expands any shard of the plan wherever it is (it builds its agent and envs on first use), and commits a result
    where the run was called. It pickles for other processes (without the caller's agent, which a worker builds
    from its recipe)."""

    plan: ShardPlan

    def episodes(self, index: int) -> int:
        """Episodes of shard ``index`` (for progress bars)."""
        ...

    def prepare(self) -> dict[str, Any]:
        """Build the agent and envs now if they are not built yet (and check that they are the run's); facts about
        it, e.g. ``agent_build_s``. :meth:`expand` prepares on first use; a worker calls it when it starts."""
        ...

    def expand(self, index: int, on_episode_end: Callable[[], None] | None = None) -> pa.Table:
        """The rollout columns of shard ``index``'s task rows, with the declared schema, in row order."""
        ...

    def commit(self, index: int, rollout_columns: pa.Table) -> None:
        """Check ``rollout_columns`` against the declared schema, join the shard's task columns, write its file.
        Only in the process that called the run."""
        ...

    def check_portable(self) -> None:
        """Raise, saying what to pass, when the task cannot run in another process (no recipe for its agent)."""
        ...


@dataclass(frozen=True)
class ExecutorOptions:
    """Where a run's shards are expanded (none of these change the rows: they are not in the cache key)."""

    executor: Literal["auto", "local", "processes", "ray"] = field(
        default="auto",
        metadata={
            "help": "Where shards are expanded: 'local' (this process), 'processes' (each process of a torchrun / "
            "accelerate launch group expands a contiguous block of shards), 'ray' (Ray workers, one agent each, "
            "retries and a per-shard deadline), 'auto' ('processes' when launched as several processes, else "
            "'local'). Named --executor because --backend is the local model's generation backend.",
            "choices": list(EXECUTORS),
        },
    )
    ray_address: str | None = field(
        default=None,
        metadata={
            "help": "Ray: address of a running cluster ('auto', 'HOST:6379', 'ray://HOST:10001'); default: a new "
            "local Ray instance. A process already connected to Ray (ray.init) uses that cluster."
        },
    )
    num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Ray: worker processes, each building its own agent; default: what the cluster's GPUs "
            "(gpus_per_worker > 0) or CPUs hold, at most one per pending shard."
        },
    )
    gpus_per_worker: float = field(default=0.0, metadata={"help": "Ray: GPUs reserved by each worker."})
    cpus_per_worker: float = field(default=1.0, metadata={"help": "Ray: CPUs reserved by each worker."})
    shard_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Ray: seconds one shard may take on a worker; past it the worker is killed and the shard "
            "retried. None: no deadline."
        },
    )
    max_shard_retries: int = field(
        default=2,
        metadata={
            "help": "Ray: times a shard is retried after its worker died or ran past shard_timeout; then the run "
            "stops with an error naming the shard."
        },
    )

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {self.executor!r}.")
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}.")
        if self.gpus_per_worker < 0 or self.cpus_per_worker < 0:
            raise ValueError("gpus_per_worker and cpus_per_worker must be >= 0.")
        if self.shard_timeout is not None and self.shard_timeout <= 0:
            raise ValueError(f"shard_timeout must be a number of seconds > 0 (or None), got {self.shard_timeout}.")
        if self.max_shard_retries < 0:
            raise ValueError(f"max_shard_retries must be >= 0, got {self.max_shard_retries}.")


@dataclass
class RunReport:
    """What an executor did in one run (``executor.report`` after ``generate_rollouts``)."""

    executor: str
    expanded: list[int] = field(default_factory=list)
    """Shards expanded and committed by this run, in commit order (each once)."""
    reused: list[int] = field(default_factory=list)
    """Shards whose file an earlier run (any executor) had already written."""
    retried: dict[int, list[str]] = field(default_factory=dict)
    """Shard index -> why each failed attempt failed (a dead worker, the deadline)."""
    workers: list[dict[str, Any]] = field(default_factory=list)
    """One entry per worker started: ``startup_s`` (agent and envs built), ``pid``, ``host``."""
    wall_s: float = 0.0
    shards: int = 0
    """Shards in the run's plan (this process's block of them with ``processes``: ``expanded`` + ``reused``)."""

    def rows(self) -> list[tuple[str, str]]:
        """What the run did, as ``(item, value)`` rows (the CLI prints them, the dataset card shows them): shards this
        run generated, shards an earlier run had already written (read from the cache, not generated again), shards
        retried and why; e.g. ``("shards generated", "2 of 3 (shards 0, 2)")``."""
        retried = "; ".join(f"shard {i}: " + ", ".join(why) for i, why in sorted(self.retried.items()))
        rows = [
            ("executor", self.executor),
            ("shards generated", f"{len(self.expanded)} of {self.shards}" + _indices(self.expanded)),
            ("shards from the cache", f"{len(self.reused)} of {self.shards}" + _indices(self.reused)),
            ("shards retried", f"{len(self.retried)}" + (f" ({retried})" if retried else "")),
        ]
        if self.workers:
            startup = sum(w.get("startup_s", 0.0) for w in self.workers) / len(self.workers)
            rows.append(("workers started", f"{len(self.workers)} (mean start-up {startup:.1f} s)"))
        return rows

    def summary(self) -> str:
        """:meth:`rows` on one line."""
        return "; ".join(f"{key} {value}" for key, value in self.rows())


def _indices(indices: list[int]) -> str:
    shown = ", ".join(map(str, sorted(indices)[:10])) + (", ..." if len(indices) > 10 else "")
    return f" ({'shard' if len(indices) == 1 else 'shards'} {shown})" if indices else ""


class Executor(ABC):
    """Runs the pending shards of a plan somewhere (see the module docstring).

    The base does the bookkeeping every executor shares (datatrove's executor base): which shards this executor is
    responsible for (:meth:`shards`), which of them are done already (*skip completed*: ``reused``), the progress
    bar, each commit (``expanded``), each retry (``retried``) and the :class:`RunReport`. A subclass says only where
    the pending shards run (:meth:`expand`), calling :meth:`commit` with each result.
    """

    name: str = "executor"
    report: RunReport | None = None

    def run(self, task: ShardTask, *, reuse: bool, progress: bool) -> RunReport:
        """Expand every shard of ``task.plan`` this executor is responsible for that is not done yet, committing
        each exactly once; return when they are committed (and, with several processes, when all are)."""
        start = time.perf_counter()
        mine = list(self.shards(task.plan))
        self.report = report = RunReport(self.name, shards=len(mine))
        todo = task.plan.pending(mine, reuse)
        report.reused = [i for i in mine if i not in set(todo)]
        if todo:
            total = sum(task.episodes(i) for i in todo)
            self._bar = tqdm(total=total, desc=self.progress_label(), unit="episode", disable=not progress)
            self._ticks: dict[int, int] = {}
            with self._bar:
                self.expand(task, todo)
        self.finish()
        report.wall_s = time.perf_counter() - start
        return report

    def shards(self, plan: ShardPlan) -> Sequence[int]:
        """The shard indices this executor expands (default: all of them)."""
        return range(len(plan.shards))

    @abstractmethod
    def expand(self, task: ShardTask, todo: list[int]) -> None:
        """Expand shards ``todo`` (pending, in plan order) somewhere, calling :meth:`commit` once for each."""

    def finish(self) -> None:
        """After this executor's shards are committed (``processes``: wait for the other processes)."""

    def progress_label(self) -> str:
        return "rollouts"

    def episode_done(self, index: int) -> Callable[[], None]:
        """A callback for shard ``index``'s episodes as they end (progress per episode, where the shard runs here)."""

        def tick() -> None:
            self._ticks[index] = self._ticks.get(index, 0) + 1
            self._bar.update(1)

        return tick

    def commit(self, task: ShardTask, index: int, rollout_columns: pa.Table) -> None:
        """Commit shard ``index`` (written by this process only) and count it as expanded."""
        task.commit(index, rollout_columns)
        self.report.expanded.append(index)
        self._bar.update(max(0, task.episodes(index) - self._ticks.pop(index, 0)))

    def retried(self, index: int, why: str) -> int:
        """Record that an attempt at shard ``index`` failed (its worker was lost); the number of failed attempts."""
        reasons = self.report.retried.setdefault(index, [])
        reasons.append(why)
        return len(reasons)


__all__ = [
    "EXECUTORS",
    "Executor",
    "ExecutorOptions",
    "RunReport",
    "ShardFailedError",
    "ShardPlan",
    "ShardTask",
    "plan_shards",
]
