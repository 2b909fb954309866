"""Token bookkeeping for one episode.

:class:`EpisodeRecorder` is the only place that appends to an episode's token
sequence, so the token-level contracts are enforced in one spot:

* environment text enters as chat-template deltas (:class:`~hf_rollouts.chat.ChatDelta`);
* agent ids enter exactly as the agent sampled them (a text-only agent's text is
  tokenized once, inside the template's assistant framing);
* a step's reward is put on that step's agent tokens (see :data:`REWARD_PLACEMENTS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..chat import ChatDelta
from ..types import Action, AgentRequest, Episode, Message, Status, Turn

REWARD_PLACEMENTS = ("last", "spread")
"""How a step reward lands on tokens. ``"last"`` (default): the whole reward on
the last agent token of that step, so a return-to-go computed from the tokens
equals the environment's. ``"spread"``: split evenly over that step's agent
tokens. Either way the per-token rewards of an episode sum to the sum of its
step rewards, and non-agent tokens always get 0. A step whose action has no
tokens puts its reward on the previous agent token; before any agent token it
is recorded in ``Episode.turns[i].info["unplaced_reward"]``."""


class EpisodeRecorder:
    """Builds one :class:`~hf_rollouts.types.Episode` turn by turn."""

    def __init__(self, chat: ChatDelta, reward_placement: str = "last") -> None:
        if reward_placement not in REWARD_PLACEMENTS:
            raise ValueError(f"reward_placement must be one of {REWARD_PLACEMENTS}, got {reward_placement!r}")
        self.chat = chat
        self.reward_placement = reward_placement
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.rewards: list[float] = []
        self.logprobs: list[float] = []
        self.sampled: list[int] = []
        self.any_logprobs = False
        self.messages: list[Message] = []
        self.turns: list[Turn] = []
        self._last_agent_ids: list[int] = []
        self._last_ended = False  # did the last agent turn end with an end-of-turn token (see ChatDelta)
        self.cut_turns = 0  # agent turns that hit the token budget before an end-of-turn token

    def _append(
        self, ids: Sequence[int], agent: bool, logprobs: Sequence[float] | None = None, sampled: bool = False
    ) -> None:
        self.ids.extend(ids)
        self.mask.extend([int(agent)] * len(ids))
        self.sampled.extend([int(sampled)] * len(ids))
        self.rewards.extend([0.0] * len(ids))
        if logprobs is not None:
            self.logprobs.extend(logprobs)
        else:
            self.logprobs.extend([math.nan if agent else 0.0] * len(ids))

    def add_env_message(self, content: str, system: str | None = None) -> None:
        """Append the environment's message (and, first turn only, an optional system prompt)."""
        if not self.ids:
            opening = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": content}
            ]
            self.messages.extend(opening)
            self._append(self.chat.initial_ids(opening), agent=False)
        else:
            if system:
                raise ValueError("A system prompt can only open an episode.")
            self.messages.append({"role": "user", "content": content})
            self._append(self.chat.user_delta_ids(content, self._last_agent_ids, ended=self._last_ended), agent=False)

    def request(self, agent_state: Any, session_id: str) -> AgentRequest:
        return AgentRequest(
            messages=list(self.messages),
            prompt_token_ids=list(self.ids),
            agent_state=agent_state,
            session_id=session_id,
        )

    def add_action(self, action: Action) -> str:
        """Append the agent's tokens; returns the action text the environment must parse."""
        start = len(self.ids)
        if action.token_ids is not None:
            ids = list(action.token_ids)
            if action.logprobs is not None:
                self.any_logprobs = True
            self._append(ids, agent=True, logprobs=action.logprobs, sampled=True)
        else:
            ids = self.chat.assistant_turn_ids(action.text, stopped=action.stopped)  # with the template's framing
            self._append(ids, agent=True)
        self._last_agent_ids = ids
        self._last_ended = self.chat.turn_ended(ids, action.stopped)
        self.messages.append({"role": "assistant", "content": action.text})
        self.turns.append(Turn(start=start, end=len(self.ids), action=action.text, reward=0.0))
        self.cut_turns += int(not action.stopped)
        return action.text

    def reward_turn(self, reward: float, info: dict[str, Any] | None = None) -> None:
        """Record the reward of the last turn on its agent tokens (see :data:`REWARD_PLACEMENTS`)."""
        reward = float(reward)
        turn = self.turns[-1]
        turn.reward = reward
        turn.info = dict(info or {})
        if reward == 0.0:
            return
        if turn.end > turn.start:
            if self.reward_placement == "last":
                self.rewards[turn.end - 1] += reward
            else:
                share = reward / (turn.end - turn.start)
                for i in range(turn.start, turn.end):
                    self.rewards[i] += share
            return
        agent_positions = [i for i, m in enumerate(self.mask) if m]
        if agent_positions:
            self.rewards[agent_positions[-1]] += reward
        else:
            turn.info["unplaced_reward"] = reward

    def finish(self, status: Status, final_reward: float, error: str | None = None) -> Episode:
        if status == "error":
            final_reward = math.nan
        episode = Episode(
            full_token_ids=self.ids,
            agent_token_mask=self.mask,
            sampled_token_mask=self.sampled,
            per_token_rewards=self.rewards,
            logprobs=self.logprobs if self.any_logprobs else None,
            final_reward=float(final_reward),
            status=status,
            error=error,
            num_turns=len(self.turns),
            num_cut_turns=self.cut_turns,
            messages=self.messages,
            turns=self.turns,
        )
        episode.check()
        return episode
