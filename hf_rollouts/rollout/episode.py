"""The episode loop: one environment, one task, from the first prompt to the end.

:func:`episode_steps` is the whole loop on one screen, written as a generator: it yields
each :class:`~hf_rollouts.types.AgentRequest` and is sent back the agent's
``(action, agent_state)``, so the engine can advance many episodes from a few threads and
answer their requests in any order (:mod:`.engine`). A hook may be ``async def``: the
loop then yields a :class:`HookAwait` and is sent back the awaited result. :func:`run_episode`
drives it with one agent, synchronously. The loop talks to the environment only through the
hooks of :class:`EpisodeEnv` (what :class:`~hf_rollouts.envs.base.MultistepEnv` implements);
every token goes through an :class:`~.recorder.EpisodeRecorder`.

Statuses: the environment ended the game → ``done``; ``max_turns`` or
``max_episode_tokens`` ran out first → ``truncated``; an exception → ``error`` with its
message, the partial trajectory and a NaN final reward (``on_error="raise"`` re-raises); a
:class:`~hf_rollouts.types.StepError` keeps its ``info`` on the last turn.
Each hook call is timed by the episode's :class:`HookClock`, which the engine reads to enforce
``step_timeout`` and ``episode_timeout``.

Release: an env that overrides ``_close_episode(session_id, state)`` has it called exactly once for every
episode whose ``_initialize_episode`` returned, whatever ended it (done, truncated, an exception, a time
limit), before the episode counts as finished, so what the state holds (a server session, a subprocess, a
sandbox) is free before the next episode starts. It is timed by ``step_timeout`` only (the episode's own
``episode_timeout`` has run out when a time limit ended it). A close that raises makes the episode ``error``.
Where nothing drives the episode any more (the engine abandoned it while a sync hook was stuck; the run
stopped), the close is called at once without waiting for it (an ``async def`` close is started on the engine
loop).

An env that overrides ``_run_complete_episode`` (its door into the engine) keeps it: :func:`door_steps` calls the
override as one sync hook, with an agent whose requests the engine answers like any other episode's.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Generator
from functools import partial
from typing import Any, Protocol

from ..agents.base import Agent
from ..aio import ENGINE_LOOP, resolve
from ..chat import ChatDelta
from ..types import Action, AgentRequest, Episode, StepError, reward_rule_violation
from .recorder import EpisodeRecorder
from .tool_loop import agent_turn, turns_left

ON_ERROR = ("record", "raise")


class EpisodeEnv(Protocol):
    """What the loop needs of an environment (see :class:`~hf_rollouts.envs.base.MultistepEnv`)."""

    chat: ChatDelta
    env_config: dict[str, Any]
    max_turns: int
    max_episode_tokens: int | None
    reward_placement: str

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> Any: ...
    def _format_prompt(self, state: Any, step: int) -> str: ...
    def _step_episode(self, session_id: str, state: Any, action: str) -> tuple[Any, float, bool, dict[str, Any]]: ...
    def _calculate_reward(self, state: Any, step_rewards: list[float]) -> float: ...
    def _system_prompt(self, state: Any) -> str | None: ...
    def _prompt_history(self, state: Any) -> list[dict[str, str]] | None: ...
    def implements(self, hook: str) -> bool:
        """Whether the env has its own optional ``hook`` (``_close_episode``, ``_calculate_group_rewards``,
        ``_run_complete_episode``), not the base class's default."""


class HookClock:
    """What an episode is doing that counts against its time limits, the time it has used, and its limits.

    ``activity`` names the charged activity running now (an env hook, or ``"agent"`` while the agent answers
    the episode's request) and ``since`` when it began; ``used`` is the seconds of finished activities. Time an
    episode spends waiting for its turn (for a worker thread, for a batch to form, behind other episodes) is
    never charged. ``step_limit`` bounds one hook call, ``episode_limit`` the time charged in all (``None``: no
    limit). ``alarm`` (set by the engine for episodes with an ``episode_limit``) is told when an activity begins, so
    the engine can look before the episode's remaining budget runs out.

    **One writer rule.** A clock is written from several threads: the worker running the episode's hooks (a hook's
    begin and end, the release's ``ending``), the engine (the agent's begin and end, a time limit's verdict). Its
    moving state (``activity``, ``since``, ``used``, ``cancelled``, ``ending``) is therefore written *only* through
    its methods, each of which holds the clock's own mutex while it reads or writes, so every reader sees one
    consistent moment. The engine's verdict is one such step (:meth:`expire`): it reads the running activity once
    and, for a sync hook, marks it cancelled in the same step, so a hook either returned before the verdict (its
    result stands) or returns after it (its episode stops there, :class:`EpisodeCancelled`), never in between.
    ``alarm``, ``lock`` and the limits are set once, before the episode's first step.
    """

    __slots__ = ("activity", "since", "used", "alarm", "cancelled", "lock", "ending", "step_limit", "episode_limit")
    __slots__ += ("_mutex",)

    def __init__(self, step_limit: float | None = None, episode_limit: float | None = None) -> None:
        self.activity: str | None = None
        self.since = 0.0
        self.used = 0.0
        self.alarm: Any = None
        self.cancelled = False  # set by the engine when it gave up on the episode: stop at the next hook
        self.lock: Any = None  # an env with thread_safe_hooks = False: its lock, held around each hook call
        self.ending = False  # the episode is over and its env releases it: only step_timeout applies now
        self.step_limit, self.episode_limit = step_limit, episode_limit
        self._mutex = threading.RLock()

    def begin(self, activity: str) -> None:
        with self._mutex:
            self.activity, self.since = activity, time.monotonic()
        if self.alarm is not None:  # outside the mutex: the engine's alarm reads the clock
            self.alarm(self)

    def end(self) -> bool:
        """The running activity is over (its time is charged); returns whether the engine cancelled the episode."""
        with self._mutex:
            if self.activity is not None:
                self.used += time.monotonic() - self.since
            self.activity = None
            return self.cancelled

    def release(self) -> None:
        """The episode is over and its env releases it: from now on only ``step_limit`` applies."""
        with self._mutex:
            self.ending = True

    def call(self, hook: str, fn: Any, *args: Any) -> Any:
        self.begin(hook)
        try:
            if self.lock is None:
                return fn(*args)
            with self.lock:  # waiting for it counts as the hook's time (it stands for the env's own work)
                return fn(*args)
        finally:
            if self.end():
                raise EpisodeCancelled(f"{hook} returned after its episode was ended")

    def spent(self) -> bool:
        """The finished activities used up the episode's budget (its next step gets ``EpisodeTimeout``)."""
        with self._mutex:
            return bool(self.episode_limit and self.used > self.episode_limit and not self.ending)

    def overrun(self, now: float) -> str | None:
        """Which limit the running activity has passed at ``now`` (a message), or None."""
        with self._mutex:
            return self._overrun(now)

    def _overrun(self, now: float) -> str | None:
        if self.activity is None:
            return None
        if self.step_limit and self.activity != AGENT and now - self.since > self.step_limit:
            return f"step_timeout: {self.activity} ran over {self.step_limit} s"
        if self.episode_limit and not self.ending and self.used + now - self.since > self.episode_limit:
            where = "" if self.activity == AGENT else f" (stuck in {self.activity})"
            return f"episode_timeout: the episode ran over {self.episode_limit} s{where}"
        return None

    def expire(self, now: float, on_worker: bool) -> tuple[str | None, bool]:
        """The engine's verdict at ``now``, in one step: ``(message, cancelled)``. ``message`` names the limit the
        running activity has passed (``None``: none); when it is a sync hook (``on_worker``: the episode runs on a
        worker, and the activity is not the agent's) the episode is cancelled at once (``cancelled`` True: its hook's
        end raises :class:`EpisodeCancelled`, and the engine abandons that worker)."""
        with self._mutex:  # re-entrant: overrun takes it too
            message = self.overrun(now)
            cancel = message is not None and on_worker and self.activity != AGENT
            if cancel:
                self.cancelled = True
            return message, cancel

    def running_for(self, now: float) -> float:
        """Seconds the running activity has run at ``now`` (-inf when nothing runs)."""
        with self._mutex:
            return -math.inf if self.activity is None else now - self.since

    def due(self) -> float:
        """The moment the running activity would pass a limit (inf: never, or nothing runs)."""
        with self._mutex:
            due = math.inf
            if self.activity is not None and self.step_limit and self.activity != AGENT:
                due = self.since + self.step_limit
            if self.activity is not None and self.episode_limit and not self.ending:
                due = min(due, self.since + self.episode_limit - self.used)
            return due


AGENT = "agent"
"""The clock's activity while the agent answers an episode's request."""


class EpisodeCancelled(Exception):
    """The engine ended the episode (a time limit) while one of its hooks ran; the hook's result is dropped."""


class EpisodeTimeout(Exception):
    """An episode ran past ``step_timeout`` or ``episode_timeout``."""


class HookAwait:
    """What an episode yields when an env hook returned an awaitable (an ``async def`` hook): the engine awaits
    it on the engine loop (:mod:`hf_rollouts.aio`) and sends back its result (or throws its exception)."""

    __slots__ = ("hook", "awaitable")

    def __init__(self, hook: str, awaitable: Any) -> None:
        self.hook, self.awaitable = hook, awaitable


Steps = Generator["AgentRequest | HookAwait", Any, Episode]


def hook_call(clock: HookClock, name: str, fn: Any, *args: Any) -> Generator[HookAwait, Any, Any]:
    """Call env hook ``fn`` (timed by ``clock``); if it returns an awaitable, yield it and return its result."""
    result = clock.call(name, fn, *args)
    if hasattr(result, "__await__"):  # inspect.isawaitable, at a third of the cost (every hook call pays it)
        result = yield HookAwait(name, result)
    return result


def episode_steps(
    env: EpisodeEnv,
    session_id: str,
    task_data: dict[str, Any],
    *,
    on_error: str = "record",
    clock: HookClock | None = None,
    recorder: EpisodeRecorder | None = None,
    seed: int | None = None,
) -> Steps:
    """Play one episode of ``task_data``: yield each agent request, receive ``(action, agent_state)``, return the
    unpadded :class:`~hf_rollouts.types.Episode`. A hook that returns an awaitable makes the episode yield a
    :class:`HookAwait` and receive its result. An exception thrown into the generator at a ``yield`` (the agent or
    an async hook failed) is recorded like any other. ``recorder`` lets the caller keep a handle on the episode's
    tokens (to record a partial trajectory if a hook never returns). With ``seed`` (the episode's), turn ``t``'s
    request carries the sampling seed ``derive_seed(seed, t)``. An env with an ``episode_loop`` method (the agent
    program env) is played by it instead, with the same arguments."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    own_loop = getattr(env, "episode_loop", None)  # an env that plays its episodes its own way (an agent program)
    if own_loop is not None:
        return (
            yield from own_loop(session_id, task_data, on_error=on_error, clock=clock, recorder=recorder, seed=seed)
        )
    rec = recorder if recorder is not None else EpisodeRecorder.for_env(env)
    clock = clock if clock is not None else HookClock()
    clock.lock = getattr(env, "hooks_lock", None)
    rec.tools = rec.tools or getattr(env, "tool_turns", None)  # set by an env with executable tools
    hook = partial(hook_call, clock)  # called as `yield from hook(name, fn, *args)`
    state: Any = _NO_STATE
    released = False
    try:
        try:
            state = yield from hook("_initialize_episode", env._initialize_episode, session_id, task_data)
            agent_state, step_rewards, done = None, [], False
            system = env.env_config.get("system_prompt") or (
                yield from hook("_system_prompt", env._system_prompt, state)
            )
            history = (
                (yield from hook("_prompt_history", env._prompt_history, state))
                if env.implements("_prompt_history")
                else None
            )
            for step in range(env.max_turns):
                if not turns_left(env, rec):  # tool-call turns count against max_turns
                    break
                prompt = yield from hook("_format_prompt", env._format_prompt, state, step)
                rec.add_env_message(
                    prompt, system=system if step == 0 else None, history=history if step == 0 else None
                )
                if env.max_episode_tokens and rec.context_length >= env.max_episode_tokens:
                    break
                text, agent_state = yield from agent_turn(env, rec, hook, session_id, state, agent_state, seed)
                if text is None:  # a tool limit ended the episode
                    break
                state, reward, done, info = yield from hook("_step_episode", env._step_episode, session_id, state, text)
                rec.reward_turn(reward, info, done=bool(done))
                step_rewards.append(float(reward))
                if done:
                    break
            final = yield from hook("_calculate_reward", env._calculate_reward, state, step_rewards)
            status, error = ("done" if done else "truncated"), None
        except Exception as exc:
            if on_error == "raise":
                raise
            status, final, error = "error", math.nan, f"{type(exc).__name__}: {exc}"
            if isinstance(exc, StepError):  # the step's own account: its message, its info on the turn
                error = str(exc)
                if rec.turns:
                    rec.turns[-1].info = exc.info
        if state is not _NO_STATE:
            released = True  # whatever happens next, the finally below does not close it again
            problem = yield from _release(env, clock, session_id, state)
            if problem is not None:
                if on_error == "raise":
                    raise RuntimeError(problem)
                status, error = "error", problem if error is None else f"{error}; then {problem}"
        if status == "error":
            return rec.finish("error", math.nan, error=error)
        kept = state if env.implements("_calculate_group_rewards") else None  # else dropped now
        return rec.finish(status, final, env_state=kept)
    finally:  # on_error="raise", or the generator closed while it waited: release without waiting
        if state is not _NO_STATE and not released:
            _release_now(env, session_id, state)


_NO_STATE = object()


def _release(env: Any, clock: HookClock, session_id: str, state: Any) -> Generator[HookAwait, Any, str | None]:
    """Call the env's ``_close_episode`` for an ended episode (see the module docstring); return what went wrong,
    or ``None``."""
    if not env.implements("_close_episode"):
        return None
    if clock.cancelled:  # the engine gave up on this episode: nobody drives this generator any more
        _release_now(env, session_id, state)
        return None
    clock.release()
    try:
        yield from hook_call(clock, "_close_episode", env._close_episode, session_id, state)
    except EpisodeCancelled:  # a sync close ran past step_timeout; the episode is recorded as error already
        return None
    except Exception as exc:
        return f"_close_episode failed: {type(exc).__name__}: {exc}"
    return None


def _release_now(env: Any, session_id: str, state: Any) -> None:
    """Call ``_close_episode`` without waiting for an async one (it is started on the engine loop)."""
    if not env.implements("_close_episode"):
        return
    try:
        result = env._close_episode(session_id, state)
        if hasattr(result, "__await__"):
            ENGINE_LOOP.submit(result)
    except Exception as exc:  # the episode has failed or was abandoned already: say so, do not hide the first error
        warnings.warn(
            f"{type(env).__name__}._close_episode failed for {session_id}: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )


def door_steps(
    env: Any, session_id: str, task_data: dict[str, Any], ask: Any, *, on_error: str, clock: HookClock
) -> Steps:
    """An episode of an env that overrides ``_run_complete_episode``: the override is called as one sync hook, with
    an agent whose ``act`` hands each request to ``ask`` (the engine's, which blocks the calling thread until the
    request is answered like any other episode's). Between two requests the override's work is timed by ``clock`` as
    the hook ``_run_complete_episode``; while a request is answered, as the agent's. Its dictionary must obey the
    reward rule: an env may not bypass the recorder (a ``RuntimeError`` that stops the run)."""

    def act(request: AgentRequest) -> tuple[Action, Any]:
        clock.end()  # the engine charges the request as the agent's time
        try:
            return ask(request)
        finally:
            clock.begin("_run_complete_episode")

    agent = _Asks(act)
    door = partial(env._run_complete_episode, on_error=on_error)
    result = yield from hook_call(clock, "_run_complete_episode", door, session_id, agent, task_data)
    problem = reward_rule_violation(result["status"], result["final_reward"], result["per_token_rewards"])
    if problem:
        raise RuntimeError(
            f"episode {session_id} of {type(env).__name__} breaks the reward rule ({problem}); an environment must not "
            "override _run_complete_episode to bypass the recorder."
        )
    return Episode.from_dict(result)


class _Asks(Agent):
    """The agent an overridden ``_run_complete_episode`` plays with inside the engine (see :func:`door_steps`)."""

    def __init__(self, act: Any) -> None:
        self.act = act  # type: ignore[method-assign]

    def get_action(self, messages: Any, agent_state: Any = None) -> Any:  # pragma: no cover - act is always used
        raise NotImplementedError


def drive(steps: Generator[Any, Any, Any], agent: Agent | None = None) -> Any:
    """Run ``steps`` (an episode or a group step) to its end on this thread: each request answered by ``agent.act``,
    each awaitable awaited on the engine loop; a failure thrown back in. Returns what the generator returns."""
    try:
        request = next(steps)
        while True:
            try:
                answer = resolve(request.awaitable) if isinstance(request, HookAwait) else agent.act(request)
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(answer)
    except StopIteration as stop:
        return stop.value


def run_episode(
    env: EpisodeEnv,
    session_id: str,
    agent: Agent,
    task_data: dict[str, Any],
    *,
    on_error: str = "record",
    seed: int | None = None,
) -> Episode:
    """Play one episode synchronously with ``agent``; return it unpadded (see the module docstring). Async hooks are
    awaited on the engine loop (:func:`~hf_rollouts.aio.resolve`)."""
    return drive(episode_steps(env, session_id, task_data, on_error=on_error, seed=seed), agent)
