"""The episode loop: one environment, one agent, one task, from the first prompt to the end.

:func:`run_episode` is the whole loop on one screen. It talks to the environment only
through the hooks of :class:`EpisodeEnv` (what :class:`~hf_rollouts.envs.base.MultistepEnv`
implements) and to the agent only through :meth:`~hf_rollouts.agents.base.Agent.act`; every
token goes through an :class:`~.recorder.EpisodeRecorder`.

Statuses: the environment ended the game → ``done``; ``max_turns`` or
``max_episode_tokens`` ran out first → ``truncated``; an exception → ``error`` with its
message, the partial trajectory and a NaN final reward (``on_error="raise"`` re-raises).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from ..agents.base import Agent
from ..chat import ChatDelta
from ..types import Episode
from .recorder import EpisodeRecorder

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


def run_episode(
    env: EpisodeEnv, session_id: str, agent: Agent, task_data: dict[str, Any], *, on_error: str = "record"
) -> Episode:
    """Play one episode of ``task_data``; return it unpadded (see the module docstring for statuses)."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    rec = EpisodeRecorder(env.chat, env.reward_placement)
    try:
        state = env._initialize_episode(session_id, task_data)
        agent_state, step_rewards, done = None, [], False
        system = env.env_config.get("system_prompt") or env._system_prompt(state)
        for step in range(env.max_turns):
            rec.add_env_message(env._format_prompt(state, step), system=system if step == 0 else None)
            if env.max_episode_tokens and len(rec.ids) >= env.max_episode_tokens:
                break
            action, agent_state = agent.act(rec.request(agent_state, session_id))
            text = rec.add_action(action)
            state, reward, done, info = env._step_episode(session_id, state, text)
            rec.reward_turn(reward, info)
            step_rewards.append(float(reward))
            if done:
                break
        final = env._calculate_reward(state, step_rewards)
        return rec.finish("done" if done else "truncated", final)
    except Exception as exc:
        if on_error == "raise":
            raise
        return rec.finish("error", math.nan, error=f"{type(exc).__name__}: {exc}")
