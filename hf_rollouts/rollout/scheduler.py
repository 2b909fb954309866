"""Run many episodes at once: each advances as soon as its own answer arrives, within time limits.

Every episode is an :func:`~.episode.episode_steps` generator. One *driver* thread advances
them: it runs an episode's env hooks until the episode yields its next agent request, then
goes on with the next ready episode. How requests reach the agent depends on the agent:

* **per-request agents** (``agent.answers_per_request``, e.g. an inference server): each
  request is submitted (:meth:`~hf_rollouts.agents.base.Agent.submit`) the moment its
  episode produces it; the answer makes that episode ready again. No barrier between turns
  or episodes: the server's own batching sees a steady stream. The pipeline keeps up to the
  agent's ``concurrency`` episodes alive.
* **client-batching agents** (the default, e.g. ``TransformersAgent``): when no episode is
  ready, every parked request goes to one ``act_batch`` call, ordered by episode. The
  batch's composition depends only on the episodes, never on timing, so a seeded run is
  reproducible (lockstep; the fastest choice for a static ``model.generate`` batch).

**Refill**: when an episode ends, the next job starts at once, keeping up to
``max_concurrency`` episodes alive. Results come back in job order whatever the completion
order, and ``on_episode_end`` (a progress bar) is called once per finished episode.

**Time limits** (seconds; ``env_config["step_timeout"]`` / ``["episode_timeout"]`` override the
run's defaults): the calling thread is a watchdog. An episode past its deadline while it waits
for the agent is ended as ``error`` (``"episode_timeout: ..."``); a late answer is dropped.
An env hook running past ``step_timeout`` (or the episode's deadline) cannot be interrupted —
Python threads cannot be killed — so the watchdog records that episode as ``error``
(``"step_timeout: _step_episode ran over 5.0 s"``) with its partial trajectory, abandons the
driver thread (a daemon: it is left running and never waited for; when the hook returns it
sees it was replaced and exits) and starts a new driver for the other episodes. The run, its
progress bar and the process exit never wait for a hung hook.

Jobs whose env overrides ``_run_complete_episode`` (its door into the engine) keep that
override: it runs in a thread of its own, its agent calls are routed through the driver.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..agents.base import Agent
from ..types import AgentRequest, Episode
from .episode import HookClock, Steps, episode_steps
from .jobs import EpisodeJob, custom_door
from .recorder import EpisodeRecorder
from .threads import DRIVERS, heap_frozen


class EpisodeTimeout(Exception):
    """An episode ran past ``step_timeout`` or ``episode_timeout``."""


_START = object()


class _Live:
    """One running episode: its generator, its deadline and what it waits for."""

    __slots__ = ("job", "steps", "recorder", "clock", "deadline", "step_limit", "episode_limit", "over", "request")

    def __init__(
        self, job: EpisodeJob, steps: Steps, recorder: EpisodeRecorder | None, clock: HookClock, limits: tuple
    ) -> None:
        self.job, self.steps, self.recorder, self.clock = job, steps, recorder, clock
        self.step_limit, self.episode_limit = limits
        self.deadline = time.monotonic() + self.episode_limit if self.episode_limit else math.inf
        self.over = False  # ended by the watchdog; a late answer is dropped
        self.request: AgentRequest | None = None


LIMIT_KEYS = ("step_timeout", "episode_timeout")


def _limit(job: EpisodeJob, key: str, default: float | None) -> float | None:
    value = job.env.env_config.get(key, default) if hasattr(job.env, "env_config") else default
    return float(value) if value else None


def _timeout_episode(live: _Live, message: str) -> dict[str, Any]:
    """The error record of an episode whose hook is stuck: a copy of what it recorded so far."""
    if live.recorder is None:
        empty = Episode([], [], [], [], None, math.nan, "error", message, 0, 0, [], [])
        return empty.to_dict()
    return live.recorder.snapshot_error(message).to_dict()


class _Engine:
    def __init__(self, jobs, agent, cap, on_error, on_episode_end, limits) -> None:
        self.agent, self.cap, self.on_error, self.on_episode_end, self.limits = (
            agent,
            cap,
            on_error,
            on_episode_end,
            limits,
        )
        self.per_request = bool(getattr(agent, "answers_per_request", False))
        self.env_limits: dict[int, tuple[float | None, float | None]] = {}
        every = [x for j in jobs for x in self._limits(j)]
        self.floor = min((x for x in every if x), default=math.inf)  # nothing started later ends sooner than this
        self.policing = not math.isinf(self.floor)
        self.todo = deque(jobs)
        self.results: list[dict[str, Any] | None] = [None] * len(jobs)
        self.remaining = len(jobs)
        self.live = 0
        self.ready: deque[tuple[_Live, Any]] = deque()
        self.parked: list[_Live] = []
        self.waiting: set[_Live] = set()
        self.alive: set[_Live] = set()
        lock = threading.RLock()
        self.cond = threading.Condition(lock)  # the driver waits on it for work
        self.watch = threading.Condition(lock)  # the watchdog waits on it for the run's end or a deadline
        self.epoch = 0
        self.running: _Live | None = None
        self.in_batch = False  # a client-batching agent's act_batch is running

        self.failure: BaseException | None = None

    # -- the driver ------------------------------------------------------------------------------------
    def drive(self, epoch: int) -> None:
        try:
            self._drive(epoch)
        except BaseException as exc:  # a bug or on_error="raise": stop the run and re-raise in the caller
            with self.cond:
                if self.epoch == epoch:
                    self.failure = self.failure or exc
                    self.watch.notify_all()

    def _drive(self, epoch: int) -> None:
        while True:
            with self.cond:
                if self.epoch != epoch or self.failure is not None or self.remaining == 0:
                    self.cond.notify_all()
                    return
                while self.todo and self.live < self.cap:
                    job = self.todo.popleft()
                    self.live += 1
                    live = self._start(job)
                    self.alive.add(live)
                    self.ready.append((live, _START))
                if self.ready:
                    live, value = self.ready.popleft()
                    self.running = live
                elif self.parked and not self.per_request:
                    batch, self.parked = sorted(self.parked, key=lambda x: x.job.order), []
                    live = None
                else:
                    self.cond.wait()
                    continue
            if live is not None:
                request = self._advance(live, value)
                with self.cond:
                    if self.epoch != epoch:
                        return  # the watchdog replaced this driver while a hook ran: abandon
                    self.running = None
                    if request is not None:
                        self._park(live, request)
            else:
                self._answer_batch(batch, epoch)

    def _limits(self, job: EpisodeJob) -> tuple[float | None, float | None]:
        """``(step_timeout, episode_timeout)`` of ``job``: its env_config's, else the run's (computed once per env)."""
        key = id(job.env)
        if key not in self.env_limits:
            self.env_limits[key] = tuple(_limit(job, k, d) for k, d in zip(LIMIT_KEYS, self.limits))  # type: ignore[assignment]
        return self.env_limits[key]

    def _start(self, job: EpisodeJob) -> _Live:
        limits = self._limits(job)
        clock = HookClock()
        door = getattr(job.env, "_run_complete_episode", None)
        if getattr(door, "engine_door", False):
            recorder = EpisodeRecorder(job.env.chat, job.env.reward_placement)
            steps = episode_steps(
                job.env,
                job.session_id,
                job.task_data,
                on_error=self.on_error,
                clock=clock,
                recorder=recorder,
                seed=job.seed,
            )
            return _Live(job, steps, recorder, clock, limits)
        return _Live(job, custom_door(job, self.on_error), None, clock, limits)

    def _advance(self, live: _Live, value: Any) -> AgentRequest | None:
        """Run ``live`` until its next request (returned) or its end (recorded, None)."""
        try:
            if time.monotonic() > live.deadline and value is not _START:
                value = EpisodeTimeout(f"episode_timeout: the episode ran over {live.episode_limit} s")
            if value is _START:
                return next(live.steps)
            if isinstance(value, BaseException):
                return live.steps.throw(value)
            return live.steps.send(value)
        except StopIteration as stop:
            self._finish(live, stop.value.to_dict() if isinstance(stop.value, Episode) else stop.value)
            return None

    def _park(self, live: _Live, request: AgentRequest) -> None:
        """Under the lock: hand ``request`` to the agent (per-request) or keep it for the next batch."""
        live.request = request
        if not self.per_request:
            self.parked.append(live)
            return
        self.waiting.add(live)
        future = self.agent.submit(request)
        future.add_done_callback(lambda f, live=live: self._answered(live, f))

    def _answered(self, live: _Live, future: Future) -> None:
        with self.cond:
            if live.over or live not in self.waiting:
                return
            self.waiting.discard(live)
            exc = future.exception()
            self.ready.append((live, exc if exc is not None else future.result()))
            self.cond.notify_all()

    def _answer_batch(self, batch: list[_Live], epoch: int) -> None:
        requests = [live.request for live in batch]
        self.in_batch = True
        try:
            answers: list[Any] = self.agent.act_batch(requests)
            if len(answers) != len(batch):
                raise RuntimeError(
                    f"{type(self.agent).__name__}.act_batch returned {len(answers)} answers for {len(batch)} requests."
                )
        except Exception as exc:  # the whole batch failed: every episode of it records the failure
            answers = [exc] * len(batch)
        finally:
            with self.cond:
                self.in_batch = False
                if self.epoch != epoch:  # the watchdog may be waiting for this call to return (an interrupt)
                    self.watch.notify_all()
        with self.cond:
            if self.epoch == epoch:
                self.ready.extend(zip(batch, answers))

    def _finish(self, live: _Live, episode: dict[str, Any]) -> None:
        with self.cond:
            if live.over:
                return
            live.over = True
            self.results[live.job.order] = episode
            self.remaining -= 1
            self.live -= 1
            self.alive.discard(live)
            if not self.remaining:
                self.watch.notify_all()
        if self.on_episode_end is not None:
            self.on_episode_end()

    # -- the watchdog (the calling thread) -------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        self._spawn()
        with self.cond:
            try:
                while self.remaining and self.failure is None:
                    self.watch.wait(timeout=self._next_check(time.monotonic()))
                    self._police(time.monotonic())
            except BaseException:  # KeyboardInterrupt: stop, but not while the agent is mid-call
                self.epoch += 1
                self.cond.notify_all()
                while self.in_batch:  # the caller may restore the model once act_batch returns (a 2nd ^C: now)
                    self.watch.wait()
                raise
            failure = self.failure
            self.epoch += 1  # any driver still running stops at its next step
            self.cond.notify_all()
        if failure is not None:
            raise failure
        return self.results  # type: ignore[return-value]

    def _spawn(self) -> None:
        DRIVERS.run(self.drive, self.epoch)

    def _next_check(self, now: float) -> float | None:
        """Under the lock: seconds until the earliest moment a limit could be passed (None: no limits).

        The watchdog sleeps until then instead of polling: a wake-up takes the GIL from the driver, which cost
        several percent with a fast agent. A hook or an episode that starts later cannot run over before
        ``floor`` (the smallest limit) from now; a live episode's deadline counts once it lies ahead (a past
        one is enforced when the episode next runs or, while it waits for a per-request agent, right now).
        """
        if not self.policing:
            return None
        wake = now + self.floor
        wake = min([wake, *(x.deadline for x in self.alive if x.deadline > now)])
        live = self.running
        if live is not None and live.clock.hook is not None and live.step_limit:
            wake = min(wake, live.clock.since + live.step_limit)
        if any(now > x.deadline for x in self.waiting):
            wake = now
        return None if math.isinf(wake) else max(0.0, wake - now) + 0.001

    def _police(self, now: float) -> None:
        """Under the lock: end episodes past their limits (see the module docstring)."""
        for live in [x for x in self.waiting if now > x.deadline]:
            self.waiting.discard(live)
            self.ready.append((live, EpisodeTimeout(f"episode_timeout: the episode ran over {live.episode_limit} s")))
            self.cond.notify_all()
        live = self.running
        if live is None or live.clock.hook is None:
            return
        hook, ran = live.clock.hook, now - live.clock.since
        if live.step_limit and ran > live.step_limit:
            message = f"step_timeout: {hook} ran over {live.step_limit} s"
        elif now > live.deadline:
            message = f"episode_timeout: the episode ran over {live.episode_limit} s (stuck in {hook})"
        else:
            return
        self.epoch += 1  # abandon the stuck driver ...
        self.running = None
        live.over = True
        self.results[live.job.order] = _timeout_episode(live, message)
        self.remaining -= 1
        self.live -= 1
        self.alive.discard(live)
        if self.on_episode_end is not None:
            self.on_episode_end()
        self._spawn()  # ... and carry on without it


def run_episodes(
    jobs: list[EpisodeJob],
    agent: Agent,
    *,
    max_concurrency: int | None = None,
    on_error: str = "record",
    on_episode_end: Callable[[], None] | None = None,
    step_timeout: float | None = None,
    episode_timeout: float | None = None,
) -> list[dict[str, Any]]:
    """Play ``jobs`` and return their unpadded episode dictionaries in job order (see the module docstring).

    ``max_concurrency`` bounds the episodes alive at once (default: all). With
    ``on_error="raise"`` the first episode exception is re-raised and no new episode starts.
    ``step_timeout``/``episode_timeout`` are the defaults of the env_config keys of the same names.
    """
    if not jobs:
        return []
    cap = len(jobs) if max_concurrency is None else max(1, max_concurrency)
    try:
        with heap_frozen():
            return _Engine(jobs, agent, cap, on_error, on_episode_end, (step_timeout, episode_timeout)).run()
    finally:
        agent.episodes_done()
