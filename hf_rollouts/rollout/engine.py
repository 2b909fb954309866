"""Play many episodes at once: each moves on as soon as its own answer or hook result arrives, within time limits.

:func:`play_groups` plays groups of rollouts (the rollouts of one task) and returns them finished, group rewards
applied (:mod:`.group`), in order; :func:`run_episodes` plays a flat list of episodes. Every episode is a generator
(:func:`~.episode.episode_steps`) and is, at any moment, in exactly one :class:`~.plays.Phase` (:mod:`.plays` holds
what a run keeps per episode, group and worker; :mod:`.limits` the time limits' enforcement). The engine's state is
changed only under one lock, by a worker routing what it advanced or by the engine loop (:mod:`hf_rollouts.aio`):

* **QUEUED → RUNNING**: *workers* (threads, :mod:`.workers`) take queued episodes one after another and advance
  each until it yields: they run its sync env hooks, never the loop, because a hung sync hook must hang a thread the
  engine can abandon. One worker serves every episode while hooks are quick; when a worker sat in a hook that
  blocks while others waited, the env's waiting episodes get workers of their own, up to ``env_workers``
  (:class:`~.workers.OffloadPolicy`).
* **AWAITING**: an ``async def`` hook's coroutine is awaited on the loop; thousands cost no thread.
* **ASKING**: the episode waits for the agent. A *per-request* agent (``agent.answers_per_request``: an inference
  server, vLLM's engine) gets each request the moment it is made (``await agent.answer(request)`` on the loop); the
  agent's own batching sees a steady stream. A *client-batching* agent (``TransformersAgent``) gets one ``act_batch``
  call, run on a worker, when every live episode is asking, with the requests in episode order: the batch depends only
  on the episodes, never on hook timing, so a seeded run is reproducible.
* **DONE**: its result is stored; the next episode starts at once (**refill**, up to ``max_concurrency`` alive).
  When the last episode of a group is done, the group's reward step (:func:`~.group.group_steps`, a generator like an
  episode, with ``step_timeout``) runs the same way. Results come back in job order whatever the completion order;
  ``on_episode_end`` (a progress bar) is called once per finished episode.

**Time limits** (seconds; ``env_config["step_timeout"]`` / ``["episode_timeout"]`` override the run's defaults):
each episode's :class:`~.episode.HookClock` charges it only for its own time (its hooks while they run, its agent
requests while they are answered, a client-batching agent's whole batch call), never for waiting for a worker, a
batch or another episode. The loop looks when a limit could next be passed. An episode past its limit while it waits
for a per-request agent or an async hook gets ``EpisodeTimeout`` (the request or the hook is cancelled; a late
answer is dropped). A sync hook past a limit cannot be interrupted (Python threads cannot be killed): the episode is
recorded as ``error`` (``"step_timeout: _step_episode ran over 5.0 s"``) with its partial trajectory, its worker is
abandoned (a daemon, never waited for; when the hook returns, its episode stops there) and another takes its place.
The run, its progress bar and the process exit never wait for a hung hook.

An env that overrides ``_run_complete_episode`` keeps its override (:func:`~.episode.door_steps`): it runs on a
worker as one sync hook, and each request it makes is answered like any other (while it waits, its worker does not
count against ``env_workers``).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from functools import partial
from typing import Any

from ..agents.base import Agent
from ..aio import ENGINE_LOOP, THREADS, torch_threads_now
from ..types import AgentRequest, Episode
from .episode import AGENT, EpisodeTimeout, HookAwait, HookClock, door_steps, episode_steps
from .group import EpisodeGroup, group_steps, settle_solved
from .jobs import EpisodeJob, GroupJob
from .limits import TimeLimits, env_limits
from .plays import START, Phase, Play, RunGroup, Worker
from .recorder import EpisodeRecorder
from .workers import DEFAULT_ENV_WORKERS, POLICY, heap_frozen


class _Engine(TimeLimits):
    """One run (see the module docstring). Its state is changed only under ``lock``, by a worker routing what it
    advanced or by the loop (an awaited result, a time limit, a look)."""

    def __init__(self, groups: list[GroupJob], agent: Agent, cap: int, options: dict[str, Any]) -> None:
        self.agent, self.cap = agent, cap
        self.on_error, self.on_episode_end = options["on_error"], options["on_episode_end"]
        self.width, self.group_step = max(1, options["env_workers"]), options["group_step"]
        self.per_request = bool(getattr(agent, "answers_per_request", False))
        self.loop = ENGINE_LOOP.loop()
        limits = env_limits([g.env for g in groups], options["step_timeout"], options["episode_timeout"])
        self.groups = [RunGroup(g, i, limits[id(g.env)]) for i, g in enumerate(groups)]
        self.floor = min((x for lim in limits.values() for x in lim if x), default=math.inf)
        self.todo = deque((g, k) for g in self.groups for k in range(len(g.job.jobs)))
        self.results: list[EpisodeGroup | None] = [None] * len(groups)
        self.remaining = len(groups)
        self.lock = threading.Lock()
        self.queue: deque[Play | list[Play]] = deque()  # QUEUED plays and batch calls (a list), taken by workers
        self.parked: list[Play] = []  # ASKING a client-batching agent: the next batch
        self.alive: set[Play] = set()  # started, not DONE
        self.live = 0  # episodes alive (max_concurrency; the batch rule)
        self.batches = 0  # act_batch calls running
        self.workers: list[Worker] = []
        self.wanted = 0  # queued plays of envs whose hooks block, since the last kick
        self.to_await: list[tuple[Play, Any]] = []  # awaitables a worker handed over, started on the loop
        self.taken = 0
        self.police_at = math.inf
        self.police_timer: asyncio.TimerHandle | None = None
        self.stopped = False
        self.done: Future = Future()
        self.quiet = threading.Event()  # stopped, and no act_batch call runs any more
        self.torch_threads = torch_threads_now()

    # -- the caller's thread ----------------------------------------------------------------------------------
    def run(self) -> list[EpisodeGroup]:
        try:
            self.loop.call_soon_threadsafe(self._safe, self._start)
            return self.done.result()
        except KeyboardInterrupt:  # stop, but not while the agent is mid-call (a 2nd ^C: now)
            self.loop.call_soon_threadsafe(self._safe, self._stop, None)
            self.quiet.wait()
            raise

    def _safe(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` under the lock, then put workers on what it queued (every entry point but a worker's own
        results goes through here). An exception in the engine stops the run and reaches the caller."""
        with self.lock:
            try:
                fn(*args)
                self._kick()
            except BaseException as exc:
                self._stop(exc)

    # -- workers (their own threads) --------------------------------------------------------------------------
    def _serve(self, me: Worker) -> None:
        while me.inbox.get() is not None:
            while not (me.abandoned or self.stopped):
                try:
                    play = self.queue.popleft()
                except IndexError:
                    break
                me.taken += 1
                if isinstance(play, list):
                    self._answer_batch(play)
                    continue
                play.worker, play.phase, me.play = me, Phase.RUNNING, play
                try:
                    out = play.advance()
                except BaseException as exc:  # a bug, or on_error="raise": the run stops and re-raises it
                    out = exc
                me.play = None
                self._safe(self._route, play, out)
                if len(self.to_await) >= 32:
                    self._hand_over()
            if me.abandoned:
                return  # the engine gave up on the hook this worker ran; its result was dropped
            with self.lock:
                me.active = False
                self._kick()  # what was queued after this worker looked
            self._hand_over()

    def _answer_batch(self, batch: list[Play]) -> None:
        requests = [play.request for play in batch]
        failure = None
        try:
            answers: list[Any] = self.agent.act_batch(requests)
            if len(answers) != len(requests):
                raise RuntimeError(
                    f"{type(self.agent).__name__}.act_batch returned {len(answers)} answers for {len(requests)} "
                    "requests."
                )
        except Exception as exc:  # the whole batch failed: every episode of it records the failure
            answers = [exc] * len(requests)
        except BaseException as exc:  # raised past act_batch (e.g. KeyboardInterrupt): the run stops
            answers, failure = [exc] * len(requests), exc
        with self.lock:
            self.batches -= 1
            for play, answer in zip(batch, answers):
                play.clock.end()
                if not self.stopped and failure is None:
                    self._answered(play, answer)
            if failure is not None:
                self._stop(failure)
            if self.stopped and not self.batches:
                self.quiet.set()
            self._kick()

    def _ask(self, play: Play, request: AgentRequest) -> Any:
        """A door's agent call (on its worker): route the request like any other and wait for the answer."""
        reply = play.reply = Future()
        with self.lock:
            play.worker.held = True
            self._route(play, request)
            self._kick()
        self._hand_over()
        try:
            return reply.result()
        finally:
            play.reply = None

    def _hand_over(self) -> None:
        """Start on the loop what workers handed over to be awaited (one wake-up of the loop for all of it)."""
        with self.lock:
            work, self.to_await = self.to_await, []
        if work:
            self.loop.call_soon_threadsafe(self._safe, self._await_all, work)

    # -- under the lock -----------------------------------------------------------------------------------------
    def _start(self) -> None:
        self.police()
        self.loop.call_later(POLICY.look, self._safe, self._look)
        self._refill()

    def _refill(self) -> None:
        while self.todo and self.live < self.cap and not self.stopped:
            group, k = self.todo.popleft()
            clock = HookClock(*group.limits)
            play = Play(clock, group, k)
            job = play.job
            env = job.env
            if env.implements("_run_complete_episode"):
                ask = partial(self._ask, play)
                play.steps = door_steps(env, job.session_id, job.task_data, ask, on_error=self.on_error, clock=clock)
            else:
                play.recorder = EpisodeRecorder.for_env(env)
                play.steps = episode_steps(
                    env, job.session_id, job.task_data, on_error=self.on_error, clock=clock, recorder=play.recorder,
                    seed=job.seed,
                )  # fmt: skip
            if clock.episode_limit:  # its remaining budget may run out before the engine would look
                clock.alarm = partial(self.alarm, play)
            self.live += 1
            self._push(play, START)

    def _push(self, play: Play, value: Any) -> None:
        play.value, play.phase = value, Phase.QUEUED
        self.alive.add(play)
        self.queue.append(play)
        self.wanted += POLICY.blocks(play.env_class)

    def _kick(self) -> None:
        """Work is queued: make sure a worker is on it, and one more per queued play of an env whose hooks block (up
        to the width)."""
        wanted, self.wanted = self.wanted, 0
        if not self.queue or self.stopped:
            return
        busy = sum(1 for w in self.workers if w.active and not w.held)
        self._wake(min(max(wanted, 0 if busy else 1), len(self.queue), self.width - busy))

    def _wake(self, n: int) -> None:
        """Wake ``n`` resting workers of the run (new ones when there are too few)."""
        for _ in range(n):
            worker = next((w for w in self.workers if not w.active), None)
            if worker is None:
                worker = Worker()
                self.workers.append(worker)
                THREADS.run(partial(self._serve, worker), self.torch_threads)
            worker.active = True
            worker.inbox.put(True)

    def _look(self) -> None:
        """Every :attr:`~.workers.OffloadPolicy.look` seconds, on the loop: if work waited behind busy workers, none
        of them took any since the last look and each sits in a hook that began ``STALL`` seconds ago or more, they
        are blocked; the envs they run are marked blocking and the waiting work gets workers of its own."""
        if self.stopped:
            return
        busy = [w for w in self.workers if w.active and not w.held]
        now, plays, taken = time.monotonic(), [w.play for w in busy], sum(w.taken for w in self.workers)
        if (
            self.queue
            and busy
            and taken == self.taken
            and all(p is not None and p.clock.running_for(now) >= POLICY.STALL for p in plays)
        ):
            POLICY.stalled({p.env_class for p in plays})
            self._wake(min(len(self.queue), self.width - len(busy)))
        else:
            POLICY.progressed()
        self.taken = taken
        self.loop.call_later(POLICY.look, self._safe, self._look)

    def _route(self, play: Play, what: Any) -> None:
        """``play`` yielded ``what`` (or ended, or raised): send it on its way."""
        if play.phase is Phase.DONE:  # ended by a time limit while it ran: its result is dropped
            getattr(getattr(what, "awaitable", None), "close", lambda: None)()
            return
        if isinstance(what, BaseException):
            self._stop(what)
        elif isinstance(what, HookAwait):
            play.phase = Phase.AWAITING
            play.clock.begin(what.hook)
            self._on_loop(play, what.awaitable)
        elif not isinstance(what, AgentRequest):  # the generator's result
            self._finish(play, what)
        else:
            play.phase, play.request = Phase.ASKING, what
            if self.per_request:
                play.clock.begin(AGENT)
                self._on_loop(play, self.agent.answer(what))
            else:
                self.parked.append(play)
                self._batch()

    def _on_loop(self, play: Play, awaitable: Any) -> None:
        if ENGINE_LOOP.in_loop_thread():
            self._await(play, awaitable)
        else:  # a worker: the loop starts it at the worker's next hand-over
            self.to_await.append((play, awaitable))

    def _await_all(self, work: list[tuple[Play, Any]]) -> None:
        for play, awaitable in work:
            if play.phase is Phase.DONE or self.stopped:
                getattr(awaitable, "close", lambda: None)()
            else:
                self._await(play, awaitable)

    def _await(self, play: Play, awaitable: Any) -> None:
        play.pending = task = asyncio.ensure_future(awaitable)
        task.add_done_callback(partial(self._safe, self._resume, play))

    def _resume(self, play: Play, task: asyncio.Future) -> None:
        if play.pending is not task:  # ended by a time limit, or the run stopped
            return
        play.pending = None
        play.clock.end()
        if task.cancelled():
            value: Any = CancelledError(f"{play.job.session_id if play.job else 'group reward'}: cancelled")
        else:
            value = task.exception() or task.result()
        self._answered(play, value)

    def _answered(self, play: Play, value: Any) -> None:
        if play.reply is not None:  # a door's worker waits for it
            play.worker.held = False
            play.phase = Phase.RUNNING
            if isinstance(value, BaseException):
                play.reply.set_exception(value)
            else:
                play.reply.set_result(value)
        else:
            self._push(play, value)

    def _batch(self) -> None:
        """Every live episode is asking: one ``act_batch`` call, the requests in episode order."""
        if self.parked and len(self.parked) == self.live:
            plays, self.parked = sorted(self.parked, key=lambda p: p.job.order), []
            for play in plays:
                play.clock.begin(AGENT)
            self.batches += 1
            self.queue.append(plays)

    def _finish(self, play: Play, result: Any) -> None:
        play.phase = Phase.DONE
        self.alive.discard(play)
        group = play.group
        if play.job is None:  # the group's reward step
            self._complete(group, result)
            return
        group.episodes[play.member] = result
        self.live -= 1
        if self.on_episode_end is not None:
            self.on_episode_end()
        group.left -= 1
        if not group.left:
            env = group.job.env
            if self.group_step and env.implements("_calculate_group_rewards"):
                step = Play(HookClock(group.limits[0]), group, None)  # step_timeout bounds the hook
                step.steps = group_steps(
                    env, group.job.task_data, group.episodes, on_error=self.on_error, clock=step.clock
                )
                self._push(step, START)
            else:
                self._complete(group, settle_solved(env, group.episodes) if self.group_step else group.episodes)
        self._refill()
        self._batch()

    def _complete(self, group: RunGroup, episodes: list[Episode]) -> None:
        self.results[group.index] = EpisodeGroup(group.job.env, group.job.task_data, episodes)
        self.remaining -= 1
        if not self.remaining:
            self._stop(None)

    def _stop(self, failure: BaseException | None) -> None:
        """The run is over (or failed, or was interrupted): nothing advances any more; async work is cancelled."""
        if self.stopped:
            return
        self.stopped = True
        for play in self.alive:
            if play.pending is not None:
                self.loop.call_soon_threadsafe(play.pending.cancel)
                play.pending = None
            if play.reply is not None and not play.reply.done():
                play.reply.set_exception(EpisodeTimeout("the run stopped"))
        for worker in self.workers:
            worker.inbox.put(None)
        if self.police_timer is not None:
            self.loop.call_soon_threadsafe(self.police_timer.cancel)
        if not self.batches:
            self.quiet.set()
        if failure is not None:
            self.done.set_exception(failure)
        elif not self.remaining:
            self.done.set_result(self.results)


def play_groups(
    groups: list[GroupJob],
    agent: Agent,
    *,
    max_concurrency: int | None = None,
    on_error: str = "record",
    on_episode_end: Callable[[], None] | None = None,
    step_timeout: float | None = None,
    episode_timeout: float | None = None,
    env_workers: int = DEFAULT_ENV_WORKERS,
    group_step: bool = True,
) -> list[EpisodeGroup]:
    """Play every episode of ``groups`` and return the groups finished, in order (see the module docstring): each
    group's episodes in rollout order with the env's group rewards applied and ``solved`` settled.

    ``max_concurrency`` bounds the episodes alive at once (default: all). With ``on_error="raise"`` the first episode
    exception is re-raised and no new episode starts. ``step_timeout``/``episode_timeout`` are the defaults of the
    env_config keys of the same names. ``env_workers`` bounds the worker threads that run sync env hooks at once.
    ``group_step=False`` leaves the episodes as played (env states kept for an env's group hook).
    """
    jobs = sum(len(g.jobs) for g in groups)
    if not jobs:
        return [EpisodeGroup(g.env, g.task_data, []) for g in groups]
    cap = jobs if max_concurrency is None else max(1, max_concurrency)
    options = dict(
        on_error=on_error, on_episode_end=on_episode_end, step_timeout=step_timeout, episode_timeout=episode_timeout,
        env_workers=env_workers, group_step=group_step,
    )  # fmt: skip
    try:
        with heap_frozen():
            return _Engine(groups, agent, cap, options).run()
    finally:
        agent.episodes_done()


def run_episodes(jobs: list[EpisodeJob], agent: Agent, **options: Any) -> list[dict[str, Any]]:
    """Play ``jobs`` (options as :func:`play_groups`) and return their unpadded episode dictionaries in job order
    (:meth:`~hf_rollouts.types.Episode.to_dict`), as played: no group step."""
    groups = [GroupJob(job.env, job.task_data, (job,)) for job in jobs]
    return [group.episodes[0].to_dict() for group in play_groups(groups, agent, group_step=False, **options)]
