"""The episode loop: one environment, one task, from the first prompt to the end.

:func:`episode_steps` is the whole loop on one screen, written as a generator: it yields
each :class:`~hf_rollouts.types.AgentRequest` and is sent back the agent's
``(action, agent_state)``, so a scheduler can advance many episodes from one thread and
answer their requests in any order (:mod:`.scheduler`). :func:`run_episode` drives it with
one agent, synchronously. The loop talks to the environment only through the hooks of
:class:`EpisodeEnv` (what :class:`~hf_rollouts.envs.base.MultistepEnv` implements); every
token goes through an :class:`~.recorder.EpisodeRecorder`.

Statuses: the environment ended the game → ``done``; ``max_turns`` or
``max_episode_tokens`` ran out first → ``truncated``; an exception → ``error`` with its
message, the partial trajectory and a NaN final reward (``on_error="raise"`` re-raises).
Each hook call is announced to an optional :class:`HookClock`, which a watchdog reads to
enforce ``step_timeout``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator
from typing import Any, Protocol

from ..agents.base import Agent
from ..chat import ChatDelta
from ..types import Action, AgentRequest, Episode
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


class HookClock:
    """Which env hook is running since when (read by the scheduler's watchdog). One per driver thread."""

    __slots__ = ("hook", "since")

    def __init__(self) -> None:
        self.hook: str | None = None
        self.since = 0.0

    def call(self, hook: str, fn: Any, *args: Any) -> Any:
        self.hook, self.since = hook, time.monotonic()
        try:
            return fn(*args)
        finally:
            self.hook = None


_NO_CLOCK = HookClock()

Steps = Generator[AgentRequest, "tuple[Action, Any]", Episode]


def episode_steps(
    env: EpisodeEnv,
    session_id: str,
    task_data: dict[str, Any],
    *,
    on_error: str = "record",
    clock: HookClock = _NO_CLOCK,
    recorder: EpisodeRecorder | None = None,
    seed: int | None = None,
) -> Steps:
    """Play one episode of ``task_data``: yield each agent request, receive ``(action, agent_state)``, return the
    unpadded :class:`~hf_rollouts.types.Episode`. An exception thrown into the generator at a ``yield`` (the
    agent failed) is recorded like any other. ``recorder`` lets the caller keep a handle on the episode's tokens
    (to record a partial trajectory if a hook never returns). With ``seed`` (the episode's), turn ``t``'s request
    carries the sampling seed ``derive_seed(seed, t)``."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    rec = recorder if recorder is not None else EpisodeRecorder(env.chat, env.reward_placement)
    rec.tools = rec.tools or getattr(env, "tool_turns", None)  # set by an env with executable tools
    hook = clock.call

    def tool_hook(name: str, fn: Any, *args: Any) -> Generator[Any, Any, Any]:  # a hook, as agent_turn calls it
        return hook(name, fn, *args)
        yield  # a generator that never yields: hooks run here, synchronously

    try:
        state = hook("_initialize_episode", env._initialize_episode, session_id, task_data)
        agent_state, step_rewards, done = None, [], False
        system = env.env_config.get("system_prompt") or hook("_system_prompt", env._system_prompt, state)
        for step in range(env.max_turns):
            if not turns_left(env, rec):  # tool-call turns count against max_turns
                break
            prompt = hook("_format_prompt", env._format_prompt, state, step)
            rec.add_env_message(prompt, system=system if step == 0 else None)
            if env.max_episode_tokens and len(rec.ids) >= env.max_episode_tokens:
                break
            text, agent_state = yield from agent_turn(env, rec, tool_hook, session_id, state, agent_state, seed)
            if text is None:  # a tool limit ended the episode
                break
            state, reward, done, info = hook("_step_episode", env._step_episode, session_id, state, text)
            rec.reward_turn(reward, info)
            step_rewards.append(float(reward))
            if done:
                break
        final = hook("_calculate_reward", env._calculate_reward, state, step_rewards)
        return rec.finish("done" if done else "truncated", final)
    except Exception as exc:
        if on_error == "raise":
            raise
        return rec.finish("error", math.nan, error=f"{type(exc).__name__}: {exc}")


def run_episode(
    env: EpisodeEnv,
    session_id: str,
    agent: Agent,
    task_data: dict[str, Any],
    *,
    on_error: str = "record",
    seed: int | None = None,
) -> Episode:
    """Play one episode synchronously with ``agent``; return it unpadded (see the module docstring)."""
    steps = episode_steps(env, session_id, task_data, on_error=on_error, seed=seed)
    try:
        request = next(steps)
        while True:
            try:
                answer = agent.act(request)
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(answer)
    except StopIteration as stop:
        return stop.value
