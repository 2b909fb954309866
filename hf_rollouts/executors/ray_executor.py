"""Shards expanded by Ray workers; the driver stays the only writer of shard files.

Each worker is a Ray actor that builds its own agent from a recipe (a model cannot be shipped) and the
envs, checks that they are the driver's (agent, tokenizer and env fingerprints, library version), then
expands whole shards on request and returns each as an Arrow table of rollout columns. The driver hands
out the pending shards of the one plan (:func:`~hf_rollouts.executors.base.plan_shards`), commits each
result as it arrives (task columns joined, file written atomically), and so the shard files, the resume
and the final dataset are exactly those of a local run.

Failures: a worker that dies (killed, out of memory, node lost) or runs past ``shard_timeout`` loses only
its current shard, which goes back to the queue and is redone by a new worker; after
``max_shard_retries`` such losses of one shard the run stops with :class:`ShardFailedError` naming it. An
exception raised by the work itself (``on_error="raise"``, a bug, a fingerprint mismatch) stops the run at
once: the work is deterministic, so a retry would raise again.

Why not Ray Data ``map_batches``: its batches are not the plan's shards (so neither seeds nor resume would
match a local run), nested ints widen to int64, and an actor that dies
re-runs its batch without any resume.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from typing import Any

from .base import Executor, ShardFailedError, ShardTask

RAY_INSTALL = 'pip install "hf_rollouts[ray]"'


def import_ray() -> Any:
    """``ray``, or an ``ImportError`` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"The Ray executor needs Ray: {RAY_INSTALL} (ray {exc.name or ''} not found).") from exc
    return ray


class _ShardWorker:
    """The Ray actor: holds the run's shard task (unpickled here, without the driver's agent), builds its agent and
    envs once, then expands shards one at a time."""

    def __init__(self, task: ShardTask) -> None:
        self.task = task

    def open(self) -> dict[str, Any]:
        return {**self.task.prepare(), "pid": os.getpid(), "host": socket.gethostname()}

    def expand(self, index: int):
        return self.task.expand(index)


class RayExecutor(Executor):
    """Expand pending shards on ``num_workers`` Ray actors (see the module docstring).

    Args:
        address: cluster to connect to (``ray.init(address=...)``), then disconnect at the end; default: a new
            local Ray instance (stopped again at the end). A process already connected (``ray.init`` called)
            uses its cluster and stays connected.
        num_workers: actors to start; default: what the cluster's GPUs (``gpus_per_worker > 0``) or CPUs hold,
            at most one per pending shard.
        gpus_per_worker: GPUs each actor reserves.
        cpus_per_worker: CPUs each actor reserves.
        shard_timeout: seconds one shard may run on a worker (``None``: no deadline); the worker is then killed.
        max_shard_retries: lost attempts of one shard before the run stops.
        runtime_env: Ray ``runtime_env`` of the actors (e.g. ``{"pip": [...]}``); hf_rollouts and any env module
            the tasks name must be importable on every node.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        num_workers: int | None = None,
        gpus_per_worker: float = 0.0,
        cpus_per_worker: float = 1.0,
        shard_timeout: float | None = None,
        max_shard_retries: int = 2,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        self.address, self.num_workers = address, num_workers
        self.gpus_per_worker, self.cpus_per_worker = gpus_per_worker, cpus_per_worker
        self.shard_timeout, self.max_shard_retries, self.runtime_env = shard_timeout, max_shard_retries, runtime_env

    def expand(self, task: ShardTask, todo: list[int]) -> None:
        task.check_portable()  # before connecting: a run without a recipe fails at once
        ray = import_ray()
        started_here = not ray.is_initialized()
        if started_here:
            kwargs = {} if self.address else {"include_dashboard": False}
            ray.init(address=self.address, **kwargs)
        try:
            _Dispatch(self, ray, task, todo).run()
        finally:
            if started_here:
                ray.shutdown()

    def progress_label(self) -> str:
        return "rollouts [ray]"

    def default_workers(self, ray: Any, pending: int) -> int:
        total = ray.cluster_resources()
        gpus, cpus = total.get("GPU", 0.0), total.get("CPU", 0.0)
        if self.gpus_per_worker > gpus:
            raise ShardFailedError(
                f"Ray workers need {self.gpus_per_worker} GPU(s) each, but the cluster has {gpus:g} in all; lower "
                "gpus_per_worker (--gpus-per-worker) or add GPU nodes."
            )
        if self.cpus_per_worker > cpus:
            raise ShardFailedError(
                f"Ray workers need {self.cpus_per_worker} CPU(s) each, but the cluster has {cpus:g} in all; lower "
                "cpus_per_worker (--cpus-per-worker)."
            )
        if self.num_workers is not None:
            return max(1, min(self.num_workers, pending))
        fits = [
            int(have // need) for have, need in ((gpus, self.gpus_per_worker), (cpus, self.cpus_per_worker)) if need > 0
        ]
        return max(1, min([pending, *fits]))


class _Dispatch:
    """One run's Ray bookkeeping on the driver: workers starting, idle and busy; shards queued and in flight. The
    commits, retries and the report are the executor base's."""

    def __init__(self, executor: RayExecutor, ray: Any, task: ShardTask, todo: list[int]) -> None:
        self.ex, self.ray, self.task = executor, ray, task
        self.queue: deque[int] = deque(todo)
        self.pending = set(todo)
        self.worker_losses = 0  # workers that died while building their agent
        options: dict[str, Any] = {
            "num_cpus": executor.cpus_per_worker,
            "num_gpus": executor.gpus_per_worker,
            "max_restarts": 0,
            "max_task_retries": 0,
        }
        if executor.runtime_env:
            options["runtime_env"] = executor.runtime_env
        self.actor_class = ray.remote(**options)(_ShardWorker)
        self.task_ref = ray.put(task)
        errors = ray.exceptions  # a worker lost (retry the shard) vs the work raised (stop: it would raise again)
        self.lost_errors = (errors.RayActorError, errors.WorkerCrashedError, errors.ObjectLostError,
                            errors.NodeDiedError, errors.OutOfMemoryError)  # fmt: skip
        self.starting: dict[Any, tuple[Any, float]] = {}  # ready ref -> (actor, time asked)
        self.idle: list[Any] = []
        self.busy: dict[Any, tuple[Any, int, float]] = {}  # result ref -> (actor, shard, time submitted)
        self.size = executor.default_workers(ray, len(todo))

    def run(self) -> None:
        try:
            for _ in range(self.size):
                self._start_worker()
            while self.pending:
                self._assign()
                refs = [*self.starting, *self.busy]
                if not refs:  # cannot happen: a queued shard always has a worker starting or busy
                    raise RuntimeError(f"Ray executor: shards {sorted(self.pending)} pending with no worker.")
                ready, _ = self.ray.wait(refs, num_returns=1, timeout=self._wait_timeout())
                for ref in ready:
                    if ref in self.starting:
                        self._worker_ready(ref)
                    elif ref in self.busy:
                        self._shard_done(ref)
                self._enforce_deadline()
        finally:
            for actor in [*self.idle, *(a for a, _ in self.starting.values()), *(a for a, _, _ in self.busy.values())]:
                self.ray.kill(actor, no_restart=True)

    # -- workers ----------------------------------------------------------------------------------------
    def _start_worker(self) -> None:
        actor = self.actor_class.remote(self.task_ref)
        self.starting[actor.open.remote()] = (actor, time.perf_counter())

    def _worker_ready(self, ref) -> None:
        actor, asked = self.starting.pop(ref)
        try:
            info = self.ray.get(ref)
        except self.lost_errors as exc:  # died while building: count it, start another
            self.worker_losses += 1
            if self.worker_losses > self.ex.max_shard_retries:
                raise ShardFailedError(
                    f"Ray workers keep dying while building the agent ({self.worker_losses} so far; last: "
                    f"{_reason(exc)}). Check the workers' logs and memory (a model per worker)."
                ) from None
            self._start_worker()
            return
        except self.ray.exceptions.RayError as exc:
            raise _cause(exc) from None  # e.g. the recipe builds another agent: the message says what differs
        self.ex.report.workers.append({**info, "startup_s": round(time.perf_counter() - asked, 3)})
        self.idle.append(actor)

    def _assign(self) -> None:
        while self.idle and self.queue:
            actor, index = self.idle.pop(), self.queue.popleft()
            self.busy[actor.expand.remote(index)] = (actor, index, time.perf_counter())

    # -- shards -----------------------------------------------------------------------------------------
    def _shard_done(self, ref) -> None:
        actor, index, _ = self.busy.pop(ref)
        try:
            table = self.ray.get(ref)
        except self.lost_errors as exc:
            self._lost(index, f"its worker died ({_reason(exc)})")
            return
        except self.ray.exceptions.RayError as exc:
            shard = self.task.plan.shards[index]
            raise ShardFailedError(
                f"shard {index} of {shard.num_shards} (task rows [{shard.start}, {shard.stop})) failed on a Ray "
                f"worker: {type(_cause(exc)).__name__}: {_cause(exc)}"
            ) from _cause(exc)
        self.ex.commit(self.task, index, table)  # the driver is the only writer of shard files
        self.pending.discard(index)
        self.idle.append(actor)

    def _lost(self, index: int, why: str) -> None:
        """Shard ``index`` lost its worker: queue it again (first) and replace the worker, or give up."""
        if self.ex.retried(index, why) > self.ex.max_shard_retries:
            reasons = self.ex.report.retried[index]
            shard = self.task.plan.shards[index]
            raise ShardFailedError(
                f"shard {index} of {shard.num_shards} (task rows [{shard.start}, {shard.stop}), file {shard.path}) "
                f"failed {len(reasons)} times: "
                + "; ".join(f"attempt {k + 1}: {r}" for k, r in enumerate(reasons))
                + f". Retries are bounded by max_shard_retries={self.ex.max_shard_retries}; finished shards are kept, "
                "so rerunning the same call redoes only the rest."
            )
        self.queue.appendleft(index)
        self._start_worker()

    def _wait_timeout(self) -> float | None:
        if self.ex.shard_timeout is None or not self.busy:
            return None
        now = time.perf_counter()
        first = min(t for _, _, t in self.busy.values())
        return max(0.0, first + self.ex.shard_timeout - now) + 0.01

    def _enforce_deadline(self) -> None:
        if self.ex.shard_timeout is None:
            return
        now = time.perf_counter()
        for ref, (actor, index, submitted) in list(self.busy.items()):
            if now - submitted > self.ex.shard_timeout:
                del self.busy[ref]
                self.ray.kill(actor, no_restart=True)
                self._lost(index, f"it ran past shard_timeout={self.ex.shard_timeout:g} s (worker killed)")


def _cause(exc: BaseException) -> BaseException:
    """The exception raised inside a Ray task (``RayTaskError.cause``), else ``exc``."""
    return getattr(exc, "cause", None) or exc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


__all__ = ["RAY_INSTALL", "RayExecutor", "import_ray"]
