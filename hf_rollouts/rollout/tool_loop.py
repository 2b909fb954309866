"""One agent turn of an episode, tool calls included: the part of the episode loop that tool environments add.

:func:`agent_turn` asks the agent, and while the agent's answer calls tools (parsed by the recorder from a turn
that ended on an end token), answers the calls with ``tool`` messages and asks again. It returns the text of
the first answer that calls no tool, which the episode loop hands to ``_step_episode`` as before; for an env
without executable tools it is exactly one request.

Limits (:class:`ToolLimits`, from the env's config):

* ``max_tool_calls_per_turn``: calls of one turn past it are not run; each is answered "not run" (status
  ``limit``, a tool error).
* ``max_tool_calls``: calls of an episode past it are answered the same way. A turn that calls tools once the
  budget is spent ends the episode (``truncated``), its calls recorded as ``limit``.
* ``count_tool_turns`` (default true): every agent turn, tool-call turns included, counts against
  ``max_turns``; calls made on the last allowed turn are recorded ``not_run`` (no agent turn could read a
  result) and the episode is ``truncated``. With false, only turns answered by ``_step_episode`` count, and
  ``max_tool_calls`` bounds the tool turns.
* ``max_episode_tokens`` is checked after each tool-result delta as after any env message.

Malformed calls are answered "could not be parsed" (status ``malformed``). The well-formed calls within the
limits go, together, to the env's ``_call_tools`` hook (run through ``hook``, like every env hook: timed, and on
the engine's env pool once hooks run there); ``tool_timeout`` bounds each call inside it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from ..seeding import derive_seed
from ..types import ToolCall, ToolResult
from .recorder import EnvOutputError, EpisodeRecorder


@dataclass(frozen=True)
class ToolLimits:
    """Limits on tool use (env config keys of the same names; ``None``: no limit)."""

    tool_timeout: float | None = None
    max_tool_calls: int | None = None
    max_tool_calls_per_turn: int | None = None
    count_tool_turns: bool = True


NO_LIMITS = ToolLimits()


def _limit_text(kind: str, n: int) -> str:
    return f"Error: not run, {kind} ({n}) is reached. Answer without calling more tools."


def _answers(
    env: Any,
    hook: Callable[..., Generator[Any, Any, Any]],
    session_id: str,
    state: Any,
    calls: list[ToolCall],
    used: int,
) -> Generator[Any, Any, list[ToolResult]]:
    """One result per call: malformed and over-limit calls answered here, the rest by the env's ``_call_tools``."""
    limits: ToolLimits = getattr(env, "tool_limits", NO_LIMITS)
    results: list[ToolResult | None] = [None] * len(calls)
    runnable = []
    for i, call in enumerate(calls):
        if limits.max_tool_calls_per_turn is not None and i >= limits.max_tool_calls_per_turn:
            results[i] = ToolResult(call, _limit_text("the limit of tool calls per turn", i), "limit")
        elif limits.max_tool_calls is not None and used + i >= limits.max_tool_calls:
            results[i] = ToolResult(
                call, _limit_text("the episode's limit of tool calls", limits.max_tool_calls), "limit"
            )
        elif call.error is not None:
            text = f"Error: this tool call could not be parsed: {call.error}. Call a tool in the format shown."
            results[i] = ToolResult(call, text, "malformed")
        else:
            runnable.append(i)
    if runnable:
        ran = yield from hook("_call_tools", env._call_tools, session_id, state, [calls[i] for i in runnable])
        if not (isinstance(ran, list) and len(ran) == len(runnable) and all(isinstance(r, ToolResult) for r in ran)):
            raise EnvOutputError(
                f"_call_tools must return one ToolResult per call ({len(runnable)}), got {type(ran).__name__} "
                f"{ran!r:.80}."
            )
        for i, result in zip(runnable, ran):
            results[i] = result
    return results  # type: ignore[return-value]


def turns_left(env: Any, rec: EpisodeRecorder) -> bool:
    """Whether another agent turn may start: always for envs without tools; with ``count_tool_turns``, while the
    episode has played fewer than ``max_turns`` agent turns (tool-call turns included)."""
    limits: ToolLimits = getattr(env, "tool_limits", NO_LIMITS)
    return not limits.count_tool_turns or len(rec.turns) < env.max_turns


def agent_turn(
    env: Any,
    rec: EpisodeRecorder,
    hook: Callable[..., Generator[Any, Any, Any]],
    session_id: str,
    state: Any,
    agent_state: Any,
    seed: int | None,
) -> Generator[Any, Any, tuple[str | None, Any]]:
    """Ask the agent until it answers without a tool call; return ``(text, agent_state)``, or ``(None,
    agent_state)`` when a limit ends the episode (see the module docstring). Yields the agent requests (and
    whatever ``hook``, the episode loop's way of calling an env hook as ``yield from hook(name, fn, *args)``,
    yields). Turn ``t`` of the episode (tool turns included) is sampled with the seed ``derive_seed(seed, t)``."""
    limits: ToolLimits = getattr(env, "tool_limits", NO_LIMITS)
    while True:
        turn_seed = None if seed is None else derive_seed(seed, len(rec.turns))
        action, agent_state = yield rec.request(agent_state, session_id, turn_seed)
        text = rec.add_action(action)
        content, calls = rec.tool_calls()
        if not calls:
            return text, agent_state
        if limits.count_tool_turns and len(rec.turns) >= env.max_turns:
            rec.record_unanswered(content, [ToolResult(c, "", "not_run") for c in calls])
            return None, agent_state
        if limits.max_tool_calls is not None and rec.num_tool_calls >= limits.max_tool_calls:
            spent = _limit_text("the episode's limit of tool calls", limits.max_tool_calls)
            rec.record_unanswered(content, [ToolResult(c, spent, "limit") for c in calls])
            return None, agent_state
        results = yield from _answers(env, hook, session_id, state, calls, rec.num_tool_calls)
        rec.add_tool_results(content, results)
        if env.max_episode_tokens and rec.context_length >= env.max_episode_tokens:
            return None, agent_state
