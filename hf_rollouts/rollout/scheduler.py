"""Run many episodes at once: each advances as soon as its own answer or hook result arrives, within time limits.

Every episode is an :func:`~.episode.episode_steps` generator. *Workers* (up to ``env_workers``
threads) advance them: a worker runs an episode's sync env hooks until the episode yields its next
agent request or an awaitable (an ``async def`` hook, awaited on the engine's loop, :mod:`.aio`),
then goes on with the next ready episode. While hooks are CPU-bound one worker does all the work
(no fight over the GIL); when every busy worker has sat in a hook for ``STALL`` seconds (I/O), a
resting worker hands the waiting episodes workers of their own (see ``_Engine._rest``). How requests
reach the agent depends on the agent:

* **per-request agents** (``agent.answers_per_request``, e.g. an inference server): each
  request is submitted (:meth:`~hf_rollouts.agents.base.Agent.submit`) the moment its
  episode produces it; the answer makes that episode ready again. No barrier between turns
  or episodes: the server's own batching sees a steady stream. The pipeline keeps up to the
  agent's ``concurrency`` episodes alive.
* **client-batching agents** (the default, e.g. ``TransformersAgent``): when every live episode
  waits for the agent, their requests go to one ``act_batch`` call, ordered by episode. The
  batch's composition depends only on the episodes, never on hook timing, so a seeded run is
  reproducible (lockstep; the fastest choice for a static ``model.generate`` batch).

**Refill**: when an episode ends, the next job starts at once, keeping up to
``max_concurrency`` episodes alive. Results come back in job order whatever the completion
order, and ``on_episode_end`` (a progress bar) is called once per finished episode.

**Time limits** (seconds; ``env_config["step_timeout"]`` / ``["episode_timeout"]`` override the
run's defaults): each episode's :class:`~.episode.HookClock` charges it only for its own time (its
hooks while they run, its agent requests while they are answered), never for waiting for a worker,
a batch or another episode. The calling thread is a watchdog. An episode past its
``episode_timeout`` while it waits for a per-request agent is ended as ``error``
(``"episode_timeout: ..."``); a late answer is dropped. An async hook past a limit is cancelled
and its episode ends as ``error``. A sync hook past a limit cannot be interrupted — Python
threads cannot be killed — so the watchdog records that episode as ``error``
(``"step_timeout: _step_episode ran over 5.0 s"``) with its partial trajectory, abandons the
worker (a daemon: it is left running and never waited for; when the hook returns, its episode
stops and the worker exits) and starts a replacement. The run, its progress bar and the process
exit never wait for a hung hook.

Jobs whose env overrides ``_run_complete_episode`` (its door into the engine) keep that
override: it runs in a thread of its own, its agent calls are routed through the workers.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

from ..agents.base import Agent
from ..types import AgentRequest, Episode
from .aio import ENGINE_LOOP
from .episode import HookAwait
from .jobs import EpisodeJob
from .live import AGENT, LIMIT_KEYS, START, EpisodeTimeout, LiveEpisode, limit_of, start_episode, timeout_record
from .threads import DRIVERS, heap_frozen

DEFAULT_ENV_WORKERS = 32
"""Worker threads that run sync env hooks at once (``env_workers``). I/O-bound hooks overlap up to this many;
CPU-bound Python hooks gain nothing from more threads (the GIL) and lose little."""


STALL, STALL_MAX = 0.001, 0.016
"""Seconds without progress after which waiting episodes get more worker threads (see ``_Engine._rest``), and the
longest the sentry waits between two looks (see ``_Engine.poll``)."""


class _Driver:
    """A worker thread's token: ``abandoned`` once the watchdog gave up on the hook it runs."""

    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


class _Engine:
    def __init__(self, jobs, agent, cap, on_error, on_episode_end, limits, workers) -> None:
        self.agent, self.cap, self.on_error, self.on_episode_end, self.limits = (
            agent,
            cap,
            on_error,
            on_episode_end,
            limits,
        )
        self.width = max(1, workers)
        self.per_request = bool(getattr(agent, "answers_per_request", False))
        self.env_limits: dict[int, tuple[float | None, float | None]] = {}
        every = [x for j in jobs for x in self._limits(j)]
        self.floor = min((x for x in every if x), default=math.inf)  # nothing that begins later ends sooner
        self.policing = not math.isinf(self.floor)
        self.todo = deque(jobs)
        self.results: list[dict[str, Any] | None] = [None] * len(jobs)
        self.remaining = len(jobs)
        self.live = 0  # started, not finished
        self.ready: deque[tuple[LiveEpisode, Any]] = deque()  # to advance, with the value to send in
        self.parked: list[LiveEpisode] = []  # client-batching: waiting for the next act_batch
        self.waiting: set[LiveEpisode] = set()  # per-request: its request is with the agent
        self.awaiting: dict[LiveEpisode, Future] = {}  # its async hook runs on the engine loop
        self.running: set[LiveEpisode] = set()  # a worker is advancing it
        self.batch: list[LiveEpisode] = []  # in the act_batch call running now
        lock = threading.RLock()
        self.cond = threading.Condition(lock)  # workers wait on it for work
        self.watch = threading.Condition(lock)  # the watchdog waits on it for the run's end or a deadline
        self.drivers = 0  # worker threads serving this run (abandoned ones not counted)
        self.idle = 0  # of them, waiting for work
        self.starting = 0  # of them, spawned but not yet running
        self.sentry = False  # a resting worker watches whether the busy ones make progress
        self.nudge = threading.Event()  # tells the sentry to take new work itself (nobody else is there)
        self.taken = 0  # items taken from ``ready`` so far (the sentry's measure of progress)
        self.grants = 0  # resting workers that may take work although others are busy (after a stall)
        self.wake_at = math.inf  # when the watchdog looks next
        self.stopped = False
        self.failure: BaseException | None = None

    # -- workers ---------------------------------------------------------------------------------------
    def drive(self, me: _Driver) -> None:
        try:
            self._drive(me)
        except BaseException as exc:  # a bug or on_error="raise": stop the run and re-raise in the caller
            with self.cond:
                if not me.abandoned:
                    self.drivers -= 1
                    self.failure = self.failure or exc
                    self.watch.notify_all()
                    self.cond.notify_all()

    def _drive(self, me: _Driver) -> None:
        with self.cond:
            self.starting -= 1
        working = False  # this worker just finished an item: it takes the next one at once
        while True:
            with self.cond:
                while True:
                    if me.abandoned:
                        return
                    if self.stopped or self.failure is not None or not self.remaining:
                        self.drivers -= 1
                        self.cond.notify_all()
                        return
                    if self.todo:
                        self._refill()
                    alone = self.drivers - self.idle - self.starting == 1  # no other worker is busy
                    if self.ready and (working or alone or self.grants):
                        if not (working or alone):
                            self.grants -= 1
                        live, value = self.ready.popleft()
                        self.taken += 1
                        if not self.ready:
                            self.grants = 0
                        live.driver = me
                        self.running.add(live)
                        break
                    if self.parked and len(self.parked) == self.live and not self.batch:
                        live, self.batch, self.parked = None, sorted(self.parked, key=lambda x: x.job.order), []
                        for x in self.batch:
                            x.clock.begin(AGENT)
                        break
                    working = False
                    self._rest()
            if live is None:
                self._answer_batch()
            else:
                result = self._advance(live, value)
                with self.cond:
                    if me.abandoned:
                        return  # the watchdog ended this episode while a hook ran: its result is dropped
                    live.driver = None
                    self.running.discard(live)
                    if result is not None:
                        if self.stopped:  # an interrupt: nothing new is sent anywhere
                            getattr(getattr(result, "awaitable", None), "close", lambda: None)()
                        else:
                            self._route(live, result)
            working = True

    def _rest(self) -> None:
        """Under the lock: wait for work. While another worker is busy, one resting worker is the *sentry*: every
        ``poll`` seconds it looks whether the busy ones took any work meanwhile. If work waited and none did, they
        are blocked (I/O in a hook), and the waiting work gets workers of its own (grants), up to ``width``. So a
        CPU-bound run keeps one worker busy (no fight over the GIL), and an I/O-bound one fans out."""
        self.idle += 1
        if not self.sentry and self.drivers - self.idle - self.starting > 0:
            self.sentry = True
            self.nudge.clear()
            stalled = self._watch()
            self.sentry = False
            if stalled and self.ready and self._blocked():
                self.grants = len(self.ready)
                helpers = min(self.grants - 1, self.idle - 1)
                for _ in range(helpers):
                    self.cond.notify()
                for _ in range(min(self.grants - 1 - helpers, self.width - self.drivers)):
                    self._spawn()
        else:
            self.cond.wait()
        self.idle -= 1

    poll = STALL
    """How long the sentry sleeps between looks: ``STALL`` after a stall, doubled (up to ``STALL_MAX``) after every
    look that found progress. Shared by every run of the process, so a CPU-bound env, whose workers always make
    progress, is looked at rarely (each look takes the GIL from the busy worker), and an env that blocks is seen
    within ``STALL`` once it has blocked before."""

    def _watch(self) -> bool:
        """Under the lock, which is let go while watching: True when work waited and the busy workers took none of
        it for ``poll`` seconds; False when the run ends, nobody is busy any more, or :meth:`_wake` nudges the
        sentry to take new work itself."""
        self.cond.release()
        try:
            while True:
                mark, wait = self.taken, _Engine.poll
                if self.nudge.wait(wait) or self.stopped or self.failure is not None or not self.remaining:
                    return False
                if self.ready:
                    if self.taken == mark:
                        _Engine.poll = STALL
                        return True
                    _Engine.poll = min(STALL_MAX, wait * 2)
                elif self.drivers - self.idle - self.starting == 0:
                    return False
        finally:
            self.cond.acquire()

    def _blocked(self) -> bool:
        """Under the lock: every busy worker is inside an env hook that began ``STALL`` seconds ago or more (so a
        worker that was only descheduled by the OS, outside a hook, does not count as blocked)."""
        now = time.monotonic()
        return bool(self.running) and all(
            x.clock.activity is not None and now - x.clock.since >= STALL for x in self.running
        )

    def _refill(self) -> None:
        """Under the lock: start jobs while fewer than ``cap`` episodes are alive."""
        while self.todo and self.live < self.cap:
            self.live += 1
            self.ready.append((self._start(self.todo.popleft()), START))
            self._wake()

    def _wake(self) -> None:
        """Under the lock: work was added. If a worker is busy it will get to it (and a sentry watches that it does,
        see :meth:`_rest`); if nobody is, a resting worker takes it at once."""
        if self.drivers - self.idle - self.starting:
            if not self.sentry:
                if self.idle:
                    self.cond.notify()
                elif not self.starting and self.drivers < self.width:
                    self._spawn()
        elif self.idle > self.sentry:
            self.cond.notify()
        elif self.sentry:
            self.nudge.set()
        elif not self.starting:
            self._spawn()

    def _spawn(self) -> None:
        self.drivers += 1
        self.starting += 1
        DRIVERS.run(self.drive, _Driver())

    def _limits(self, job: EpisodeJob) -> tuple[float | None, float | None]:
        """``(step_timeout, episode_timeout)`` of ``job``: its env_config's, else the run's (computed once per env)."""
        key = id(job.env)
        if key not in self.env_limits:
            self.env_limits[key] = tuple(limit_of(job, k, d) for k, d in zip(LIMIT_KEYS, self.limits))  # type: ignore[assignment]
        return self.env_limits[key]

    def _start(self, job: EpisodeJob) -> LiveEpisode:
        live = start_episode(job, self.on_error, self._limits(job))
        if live.episode_limit:  # its remaining budget may end before the watchdog would look
            live.clock.alarm = lambda _clock, live=live: self._alarm(live)
        return live

    def _advance(self, live: LiveEpisode, value: Any) -> AgentRequest | HookAwait | None:
        """Run ``live`` until its next request or awaitable (returned) or its end (recorded, None)."""
        try:
            if value is START:
                return next(live.steps)
            over = live.episode_limit and live.clock.used > live.episode_limit and not live.clock.ending
            if over and not isinstance(value, BaseException):
                value = EpisodeTimeout(f"episode_timeout: the episode ran over {live.episode_limit} s")
            if isinstance(value, BaseException):
                return live.steps.throw(value)
            return live.steps.send(value)
        except StopIteration as stop:
            self._finish(live, stop.value.to_dict() if isinstance(stop.value, Episode) else stop.value)
            return None

    def _route(self, live: LiveEpisode, what: AgentRequest | HookAwait) -> None:
        """Under the lock: send what ``live`` waits for on its way (the agent, a batch, the engine loop)."""
        if isinstance(what, HookAwait):
            live.clock.begin(what.hook)
            future = ENGINE_LOOP.submit(what.awaitable)
            self.awaiting[live] = future
            future.add_done_callback(lambda f, live=live: self._resume(live, f, self.awaiting))
            return
        live.request = what
        if not self.per_request:
            self.parked.append(live)
            return
        self.waiting.add(live)
        live.clock.begin(AGENT)
        future = self.agent.submit(what)
        future.add_done_callback(lambda f, live=live: self._resume(live, f, self.waiting))

    def _resume(self, live: LiveEpisode, future: Future, pending: set | dict) -> None:
        """An answer or an async hook's result arrived (any thread): ``live`` is ready again."""
        with self.cond:
            if live.over or live not in pending:
                return  # ended by the watchdog meanwhile
            if isinstance(pending, dict):
                del pending[live]
            else:
                pending.discard(live)
            live.clock.end()
            if future.cancelled():
                value: Any = CancelledError(f"{live.job.session_id}: cancelled")
            else:
                value = future.exception() or future.result()
            self.ready.append((live, value))
            self._wake()

    def _answer_batch(self) -> None:
        batch = self.batch
        requests = [live.request for live in batch]
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
                self.batch = []
                for live in batch:
                    live.clock.end()
                if self.stopped:  # the watchdog may be waiting for this call to return (an interrupt)
                    self.watch.notify_all()
        with self.cond:
            if not self.stopped:
                self.ready.extend(item for item in zip(batch, answers) if not item[0].over)
                self._wake()

    def _finish(self, live: LiveEpisode, episode: dict[str, Any]) -> None:
        with self.cond:
            if live.over:
                return
            self._close(live, episode)
        if self.on_episode_end is not None:
            self.on_episode_end()

    def _close(self, live: LiveEpisode, episode: dict[str, Any]) -> None:
        """Under the lock: store ``live``'s result; its slot is free for the next job."""
        live.over = True
        self.results[live.job.order] = episode
        self.remaining -= 1
        self.live -= 1
        if not self.remaining:
            self.watch.notify_all()
        if self.idle > self.sentry:
            self.cond.notify()  # a refill, or a batch that only waited for this episode

    # -- the watchdog (the calling thread) -------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        with self.cond:
            self._spawn()
            try:
                while self.remaining and self.failure is None:
                    now = time.monotonic()
                    self.wake_at = self._next_check(now)
                    self.watch.wait(timeout=None if math.isinf(self.wake_at) else self.wake_at - now)
                    self.wake_at = math.inf
                    self._police(time.monotonic())
            except BaseException:  # KeyboardInterrupt: stop, but not while the agent is mid-call
                self._stop()
                while self.batch:  # the caller may restore the model once act_batch returns (a 2nd ^C: now)
                    self.watch.wait()
                raise
            failure = self.failure
            self._stop()
        if failure is not None:
            raise failure
        return self.results  # type: ignore[return-value]

    def _stop(self) -> None:
        """Under the lock: no episode advances any more; async hooks still running are cancelled."""
        self.stopped = True
        for future in self.awaiting.values():
            future.cancel()
        self.cond.notify_all()

    def _alarm(self, live: LiveEpisode) -> None:
        """An activity of ``live`` began (any thread): wake the watchdog if it could run over before it would look."""
        if live.due() < self.wake_at:
            with self.cond:
                self.watch.notify_all()

    def _next_check(self, now: float) -> float:
        """Under the lock: the earliest moment a limit could be passed (inf: no limits).

        The watchdog sleeps until then instead of polling: a wake-up takes the GIL from the workers. An activity
        that begins later cannot pass its step limit before ``floor`` (the smallest limit) from now; one whose
        episode has less budget left than that rings :meth:`_alarm`.
        """
        if not self.policing:
            return math.inf
        wake = now + self.floor
        for live in (*self.running, *self.awaiting, *self.waiting, *self.batch):
            wake = min(wake, live.due())
        return wake + 0.001

    def _police(self, now: float) -> None:
        """Under the lock: end episodes past their limits (see the module docstring)."""
        for live in [x for x in self.waiting if x.overrun(now)]:  # its request is with a per-request agent
            self.waiting.discard(live)
            live.clock.end()
            self.ready.append((live, EpisodeTimeout(f"episode_timeout: the episode ran over {live.episode_limit} s")))
            self._wake()
        for live, future in [(x, f) for x, f in self.awaiting.items() if x.overrun(now)]:  # an async hook: cancel it
            message = live.overrun(now)
            del self.awaiting[live]
            live.clock.end()
            future.cancel()
            self.ready.append((live, EpisodeTimeout(message)))
            self._wake()
        for live in [x for x in self.running if x.overrun(now)]:  # a sync hook: abandon its worker
            message = live.overrun(now)
            self.running.discard(live)
            live.clock.cancelled = True  # if the hook ever returns, its episode stops there
            live.driver.abandoned = True
            self.drivers -= 1
            self._close(live, timeout_record(live, message))
            if self.on_episode_end is not None:
                self.on_episode_end()
            self._spawn()  # the pool replaces the stuck worker


def run_episodes(
    jobs: list[EpisodeJob],
    agent: Agent,
    *,
    max_concurrency: int | None = None,
    on_error: str = "record",
    on_episode_end: Callable[[], None] | None = None,
    step_timeout: float | None = None,
    episode_timeout: float | None = None,
    env_workers: int = DEFAULT_ENV_WORKERS,
) -> list[dict[str, Any]]:
    """Play ``jobs`` and return their unpadded episode dictionaries in job order (see the module docstring).

    ``max_concurrency`` bounds the episodes alive at once (default: all). With
    ``on_error="raise"`` the first episode exception is re-raised and no new episode starts.
    ``step_timeout``/``episode_timeout`` are the defaults of the env_config keys of the same names.
    ``env_workers`` bounds the worker threads that run sync env hooks at once.
    """
    if not jobs:
        return []
    cap = len(jobs) if max_concurrency is None else max(1, max_concurrency)
    try:
        with heap_frozen():
            limits = (step_timeout, episode_timeout)
            return _Engine(jobs, agent, cap, on_error, on_episode_end, limits, env_workers).run()
    finally:
        agent.episodes_done()
