"""Replaying stored episodes: the stored agent tokens played back through the envs, with no policy.

:class:`StoredTokensAgent` answers each request of a replayed episode with the stored agent tokens that follow the
request's prompt in the stored sequence (one run of agent-mask tokens: one agent turn), so the env computes its
messages, rewards and verdicts again from exactly what the agent said (the turn's text is the stored conversation's
assistant message, what the env parsed). That re-derives every reward with the
recorded verifier and every env token, and needs no model (``hf-rollouts verify --rewards-only``). A prompt that is
not a prefix of the stored sequence means the env said something else than what was stored: the agent then raises
:class:`ReplayDiverged`, which ends that episode as an ``error`` naming the position, and the comparison reports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..agents.base import Agent
from ..types import Action, AgentRequest, Message

SESSION = re.compile(r"^row(\d+)/task\d+/rollout(\d+)$")
"""The session ids :func:`~hf_rollouts.expansion.play_rows` gives an episode: ``row{i}/task0/rollout{r}``."""


class ReplayDiverged(RuntimeError):
    """The env's prompt is not a prefix of the stored sequence."""


@dataclass(frozen=True)
class StoredEpisode:
    """One stored rollout, unpadded: its ids, agent mask and log-probs (``None``: none stored), cut turns, and the
    text of each agent turn as the env parsed it (the conversation's assistant messages; ``None``: not stored)."""

    ids: list[int]
    agent_mask: list[int]
    logprobs: list[float] | None
    cut_turns: int
    texts: list[str] | None = None

    def turn_index(self, position: int) -> int:
        """How many agent turns start before ``position``."""
        mask = self.agent_mask
        return sum(1 for i in range(min(position, len(mask))) if mask[i] and (i == 0 or not mask[i - 1]))


def stored_episode(row: dict[str, Any], rollout: int) -> StoredEpisode:
    """Rollout ``rollout`` of a stored rollout-dataset ``row``, without its padding."""
    length = sum(row["padded_full_attention_mask"][rollout])
    logprobs = (row.get("padded_logprobs") or [None] * (rollout + 1))[rollout]
    cut = row.get("num_cut_turns")
    chat = (row.get("conversations") or [None] * (rollout + 1))[rollout]
    return StoredEpisode(
        ids=list(row["padded_full_token_ids"][rollout][:length]),
        agent_mask=list(row["padded_agent_token_mask"][rollout][:length]),
        logprobs=None if logprobs is None else list(logprobs[:length]),
        cut_turns=int(cut[rollout]) if cut else 0,
        texts=None if chat is None else [m["content"] for m in chat if m["role"] == "assistant"],
    )


class StoredTokensAgent(Agent):
    """Plays back stored agent turns (see the module docstring).

    ``episodes[(row, rollout)]``: the stored episode of rollout ``rollout`` of task row ``row`` (the row's index in
    the run that made it, which seeds it). ``max_new_tokens``: the recorded budget of a turn; a stored turn that
    long, in an episode that had cut turns, is answered as cut (``stopped=False``), as it was recorded.
    """

    def __init__(self, episodes: dict[tuple[int, int], StoredEpisode], tokenizer: Any, max_new_tokens: int) -> None:
        self.episodes, self.tokenizer, self.max_new_tokens = episodes, tokenizer, max_new_tokens

    def get_action(self, messages: list[Message], agent_state: Any = None) -> tuple[str, Any]:
        raise ReplayDiverged("StoredTokensAgent answers token requests only (act_batch).")

    def act_batch(self, requests: list[AgentRequest]) -> list[tuple[Action, Any] | Exception]:
        out: list[tuple[Action, Any] | Exception] = []
        for request in requests:
            try:
                out.append((self._turn(request), request.agent_state))
            except ReplayDiverged as exc:
                out.append(exc)
        return out

    def _turn(self, request: AgentRequest) -> Action:
        found = SESSION.match(request.session_id)
        if found is None or (int(found[1]), int(found[2])) not in self.episodes:
            raise ReplayDiverged(f"no stored episode for session {request.session_id!r}")
        episode = self.episodes[(int(found[1]), int(found[2]))]
        prompt, n = request.prompt_token_ids, len(request.prompt_token_ids)
        if episode.ids[:n] != list(prompt):
            at = next((i for i, (a, b) in enumerate(zip(episode.ids, prompt)) if a != b), min(n, len(episode.ids)))
            raise ReplayDiverged(
                f"the env's prompt leaves the stored sequence at position {at} "
                f"(stored {episode.ids[at] if at < len(episode.ids) else 'end'}, "
                f"env {prompt[at] if at < n else 'end'})"
            )
        end = n
        while end < len(episode.ids) and episode.agent_mask[end]:
            end += 1
        if end == n:
            raise ReplayDiverged(f"the stored episode has no agent turn at position {n}")
        ids = episode.ids[n:end]
        logprobs = episode.logprobs[n:end] if episode.logprobs is not None else None
        cut = episode.cut_turns > 0 and len(ids) >= self.max_new_tokens
        turn = episode.turn_index(n)
        texts = episode.texts
        text = (
            texts[turn]
            if texts is not None and turn < len(texts)
            else self.tokenizer.decode(ids, skip_special_tokens=True)
        )
        return Action(text=text, token_ids=ids, logprobs=logprobs, stopped=not cut)

    def fingerprint(self) -> dict[str, Any]:
        return {**self._identity(), "episodes": len(self.episodes)}


__all__ = ["ReplayDiverged", "StoredEpisode", "StoredTokensAgent", "stored_episode"]
