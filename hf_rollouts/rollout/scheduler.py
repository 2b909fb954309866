"""Run many episodes at once, sharing every agent call.

Each episode runs as the plain sequential loop of
:meth:`~hf_rollouts.envs.base.MultistepEnv._run_complete_episode` (:func:`~.episode.run_episode`), in its own
worker thread. The agent those loops see is a :class:`_BatchSlot`: its ``act``
parks the request in a :class:`LockstepBatcher` and blocks. When *every* live
episode is parked, the calling thread sends all parked requests to the real agent
as one ``act_batch`` call (ordered by episode), hands out the answers, and the
loops go on. Episodes that finish simply stop taking part.

Why lockstep rather than "flush after a timeout": the composition and order of
every batch depends only on the episodes, never on thread timing, so sampling
with a seeded agent is reproducible run to run.

Generation calls for N concurrent episodes of at most T turns: at most T (with
``max_concurrency >= N``), instead of N × T one by one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..agents.base import Agent
from ..types import Action, AgentRequest


class PlaysEpisodes(Protocol):
    """An environment's door to one episode (``MultistepEnv._run_complete_episode``)."""

    def _run_complete_episode(
        self, session_id: str, agent: Agent, task_data: dict[str, Any], *, on_error: str = ...
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: which env, which task, which rollout."""

    env: PlaysEpisodes
    task_data: dict[str, Any]
    session_id: str
    order: int


def episode_jobs(
    env: PlaysEpisodes, task_data_list: list[dict[str, Any]], num_rollouts: int, *, prefix: str = "", start: int = 0
) -> list[EpisodeJob]:
    """The ``len(task_data_list) * num_rollouts`` episodes of a trial, task-major."""
    return [
        EpisodeJob(env, task, f"{prefix}task{t}/rollout{r}", start + t * num_rollouts + r)
        for t, task in enumerate(task_data_list)
        for r in range(num_rollouts)
    ]


class _Parked:
    __slots__ = ("order", "request", "result", "error", "ready")

    def __init__(self, order: int, request: AgentRequest) -> None:
        self.order, self.request = order, request
        self.result: tuple[Action, Any] | None = None
        self.error: BaseException | None = None
        self.ready = False


class LockstepBatcher:
    """Collects one request from every live episode; the serving thread then makes one agent call.

    Episode threads only park requests (:meth:`act`) and wait. The thread that called
    :func:`run_episodes` runs :meth:`serve`, so every agent call happens on that one
    thread: thread-local state (torch grad mode, CUDA stream, OpenMP team) is the
    caller's, and on CPU no new thread pays to start its own OpenMP team.
    """

    def __init__(self, agent: Agent, live: int) -> None:
        self.agent = agent
        self._live = live
        self._parked: list[_Parked] = []
        self._cv = threading.Condition()
        self.batch_sizes: list[int] = []

    def act(self, order: int, request: AgentRequest) -> tuple[Action, Any]:
        slot = _Parked(order, request)
        with self._cv:
            self._parked.append(slot)
            self._cv.notify_all()
            while not slot.ready:
                self._cv.wait()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def leave(self) -> None:
        """An episode worker has no more episodes to play."""
        with self._cv:
            self._live -= 1
            self._cv.notify_all()

    def serve(self) -> None:
        """Answer batches until every worker has left. Call from the thread that owns the agent."""
        while True:
            with self._cv:
                while self._live > 0 and (not self._parked or len(self._parked) < self._live):
                    self._cv.wait()
                if self._live == 0 and not self._parked:
                    return
                batch = sorted(self._parked, key=lambda s: s.order)
                self._parked = []
            self._answer(batch)  # every live episode is parked: nothing else moves meanwhile
            with self._cv:
                for s in batch:
                    s.ready = True
                self._cv.notify_all()

    def _answer(self, batch: list[_Parked]) -> None:
        self.batch_sizes.append(len(batch))
        try:
            results = self.agent.act_batch([s.request for s in batch])
            if len(results) != len(batch):
                raise RuntimeError(
                    f"{type(self.agent).__name__}.act_batch returned {len(results)} answers for {len(batch)} requests."
                )
            for s, r in zip(batch, results):
                if isinstance(r, BaseException):
                    s.error = r  # only this request failed
                else:
                    s.result = r
        except BaseException as exc:  # every episode of the batch records the failure
            for s in batch:
                s.error = exc


class _BatchSlot(Agent):
    """What one episode sees as its agent: forwards to the shared batcher."""

    def __init__(self, batcher: LockstepBatcher, order: int) -> None:
        self.batcher, self.order = batcher, order

    def get_action(self, messages, agent_state=None):  # pragma: no cover - act is always used
        raise NotImplementedError

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        return self.batcher.act(self.order, request)


def run_episodes(
    jobs: list[EpisodeJob],
    agent: Agent,
    *,
    max_concurrency: int | None = None,
    on_error: str = "record",
    on_episode_end: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Play ``jobs`` concurrently and return their unpadded episode dictionaries in job order.

    ``max_concurrency`` bounds the episodes alive at once (default: all).
    With ``on_error="raise"`` the first episode exception is re-raised after
    all workers stop. ``on_episode_end`` is called once per finished episode
    (e.g. to advance a progress bar).
    """
    if not jobs:
        return []
    try:
        return _run(jobs, agent, max_concurrency, on_error, on_episode_end)
    finally:
        agent.episodes_done()


def _run(
    jobs: list[EpisodeJob],
    agent: Agent,
    max_concurrency: int | None,
    on_error: str,
    on_episode_end: Callable[[], None] | None,
) -> list[dict[str, Any]]:
    workers = len(jobs) if max_concurrency is None else max(1, min(max_concurrency, len(jobs)))
    if workers == 1:
        results = []
        for job in jobs:
            results.append(job.env._run_complete_episode(job.session_id, agent, job.task_data, on_error=on_error))
            if on_episode_end:
                on_episode_end()
        return results

    batcher = LockstepBatcher(agent, live=workers)
    todo: queue.SimpleQueue[EpisodeJob] = queue.SimpleQueue()
    for job in jobs:
        todo.put(job)
    results: list[dict[str, Any] | None] = [None] * len(jobs)
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            while not failures:  # after a failure under on_error="raise", start no new episode
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    slot = _BatchSlot(batcher, job.order)
                    results[job.order] = job.env._run_complete_episode(
                        job.session_id, slot, job.task_data, on_error=on_error
                    )
                except BaseException as exc:
                    failures.append(exc)
                    return
                if on_episode_end:
                    on_episode_end()
        finally:
            batcher.leave()

    threads = [threading.Thread(target=worker, name=f"hf-rollouts-episode-{i}", daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    batcher.serve()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return results  # type: ignore[return-value]
