"""Replaying stored episodes: the stored agent tokens played back through the envs, with no policy.

:class:`StoredTokensAgent` answers each request of a replayed episode with the stored agent tokens that follow the
request's prompt in the stored sequence of its sample (one run of agent-mask tokens: one agent turn), so the env
computes its messages, rewards and verdicts again from exactly what the agent said. That re-derives every reward
with the recorded verifier and every env token, and needs no model (``hf-rollouts verify --rewards-only``).

An episode is one or more samples (:mod:`hf_rollouts.sample`): the ``earlier_*`` columns and the ``padded_*`` ones
(the last sample). The stored episode holds them all; each call's prompt is looked up in the sample its call number
falls in (``sample_calls``), and otherwise in the first sample whose ids start with the prompt and hold an agent turn
right after it. The turn's text is the stored conversation's assistant message of that turn (counted over all
samples: what the env parsed), or, for an env whose conversation is not the agent's turns (an agent program's own
history, :class:`~hf_rollouts.envs.program.ProgramEnv`), the stored agent ids decoded as the transformers agent
decodes them. A prompt that is no sample's prefix means the env said something else than what was stored: the agent
then raises :class:`ReplayDiverged`, which ends that episode as an ``error`` naming the position, and the comparison
reports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..agents.base import Agent
from ..types import Action, AgentRequest, Message

SESSION = re.compile(r"^row(\d+)/task\d+/rollout(\d+)$")
"""The session ids :func:`~hf_rollouts.expansion.play_rows` gives an episode: ``row{i}/task0/rollout{r}``."""


class ReplayDiverged(RuntimeError):
    """The env's prompt is not a prefix of the stored sequence."""


@dataclass(frozen=True)
class StoredSample:
    """One stored sample, unpadded: its ids, agent mask and log-probs (``None``: none stored)."""

    ids: list[int]
    agent_mask: list[int]
    logprobs: list[float] | None

    def turns_before(self, position: int) -> int:
        """How many agent turns of this sample start before ``position``."""
        mask = self.agent_mask
        return sum(1 for i in range(min(position, len(mask))) if mask[i] and (i == 0 or not mask[i - 1]))

    def turn_at(self, n: int) -> int:
        """The end of the agent turn starting at ``n`` (``n`` itself: none starts there)."""
        end = n
        while end < len(self.ids) and self.agent_mask[end]:
            end += 1
        return end


@dataclass(frozen=True)
class StoredEpisode:
    """One stored rollout: its samples (earlier ones first, the last one the ``padded_*`` columns), the calls each
    holds (``sample_calls``; empty for one sample), cut turns, and the text of each agent turn over the whole
    episode as the env parsed it (the conversation's assistant messages; ``None``: decode the stored ids)."""

    samples: list[StoredSample]
    cut_turns: int
    texts: list[str] | None = None
    sample_calls: list[int] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        """The last sample's ids."""
        return self.samples[-1].ids

    def sample_of_call(self, call: int) -> int | None:
        """The sample the ``call``-th model call (0-based) was recorded in, by ``sample_calls`` (``None``: past
        them)."""
        if not self.sample_calls:
            return 0 if len(self.samples) == 1 else None
        bound = 0
        for s, calls in enumerate(self.sample_calls):
            bound += calls
            if call < bound:
                return s
        return None

    def first_turn(self, sample: int) -> int:
        """The episode-wide index of sample ``sample``'s first turn."""
        return sum(self.sample_calls[:sample])


def stored_episode(row: dict[str, Any], rollout: int, env_class: type | None = None) -> StoredEpisode:
    """Rollout ``rollout`` of a stored rollout-dataset ``row``, without its padding, every sample of it.

    ``env_class``: the row's env class; a :class:`~hf_rollouts.envs.program.ProgramEnv` (its conversation is the
    program's own history, not the agent's turns) has its turn texts decoded from the stored agent ids."""
    length = sum(row["padded_full_attention_mask"][rollout])
    logprobs = (row.get("padded_logprobs") or [None] * (rollout + 1))[rollout]
    last = StoredSample(
        ids=list(row["padded_full_token_ids"][rollout][:length]),
        agent_mask=list(row["padded_agent_token_mask"][rollout][:length]),
        logprobs=None if logprobs is None else list(logprobs[:length]),
    )
    earlier_ids = (row.get("earlier_token_ids") or [[]] * (rollout + 1))[rollout] or []
    earlier_mask = (row.get("earlier_agent_token_mask") or [[]] * (rollout + 1))[rollout] or []
    earlier_lp = (row.get("earlier_logprobs") or [None] * (rollout + 1))[rollout] or [None] * len(earlier_ids)
    if len(earlier_mask) != len(earlier_ids):
        raise ValueError(
            f"rollout {rollout}: earlier_token_ids holds {len(earlier_ids)} samples but earlier_agent_token_mask "
            f"{len(earlier_mask)}; the dataset's earlier_* columns must be kept together"
        )
    samples = [
        StoredSample(list(ids), list(mask), None if lp is None else list(lp))
        for ids, mask, lp in zip(earlier_ids, earlier_mask, earlier_lp)
    ]
    cut = row.get("num_cut_turns")
    chat = (row.get("conversations") or [None] * (rollout + 1))[rollout]
    calls = (row.get("sample_calls") or [[]] * (rollout + 1))[rollout] or []
    from ..envs.program.env import ProgramEnv  # lazily: only to tell a program's rows

    decode = env_class is not None and issubclass(env_class, ProgramEnv)
    return StoredEpisode(
        samples=[*samples, last],
        cut_turns=int(cut[rollout]) if cut else 0,
        texts=None if chat is None or decode else [m["content"] for m in chat if m["role"] == "assistant"],
        sample_calls=list(calls),
    )


class StoredTokensAgent(Agent):
    """Plays back stored agent turns (see the module docstring).

    ``episodes[(row, rollout)]``: the stored episode of rollout ``rollout`` of task row ``row`` (the row's index in
    the run that made it, which seeds it). ``max_new_tokens``: the recorded budget of a turn; a stored turn that
    long, in an episode that had cut turns, is answered as cut (``stopped=False``), as it was recorded.
    """

    def __init__(self, episodes: dict[tuple[int, int], StoredEpisode], tokenizer: Any, max_new_tokens: int) -> None:
        self.episodes, self.tokenizer, self.max_new_tokens = episodes, tokenizer, max_new_tokens
        self.calls: dict[tuple[int, int], int] = {}  # model calls answered so far, per episode

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

    def _pick(self, episode: StoredEpisode, call: int, prompt: list[int]) -> int:
        """The sample holding call ``call`` whose prompt is ``prompt`` (see the module docstring)."""
        n = len(prompt)

        def fits(s: int) -> bool:
            sample = episode.samples[s]
            return sample.ids[:n] == prompt and sample.turn_at(n) > n

        expected = episode.sample_of_call(call)
        if expected is not None and fits(expected):
            return expected
        found = next((s for s in range(len(episode.samples)) if fits(s)), None)
        if found is not None:
            return found
        sample = episode.samples[expected if expected is not None else -1]
        ids = sample.ids
        if ids[:n] == prompt:
            raise ReplayDiverged(f"the stored episode has no agent turn at position {n} (call {call})")
        at = next((i for i, (a, b) in enumerate(zip(ids, prompt)) if a != b), min(n, len(ids)))
        where = f"sample {expected}" if expected is not None and len(episode.samples) > 1 else "the stored sequence"
        raise ReplayDiverged(
            f"call {call}: the env's prompt leaves {where} at position {at} "
            f"(stored {ids[at] if at < len(ids) else 'end'}, env {prompt[at] if at < n else 'end'})"
        )

    def _turn(self, request: AgentRequest) -> Action:
        found = SESSION.match(request.session_id)
        key = None if found is None else (int(found[1]), int(found[2]))
        if key is None or key not in self.episodes:
            raise ReplayDiverged(f"no stored episode for session {request.session_id!r}")
        episode = self.episodes[key]
        call = self.calls.get(key, 0)
        self.calls[key] = call + 1
        prompt = list(request.prompt_token_ids)
        n = len(prompt)
        s = self._pick(episode, call, prompt)
        sample = episode.samples[s]
        end = sample.turn_at(n)
        ids = sample.ids[n:end]
        logprobs = sample.logprobs[n:end] if sample.logprobs is not None else None
        cut = episode.cut_turns > 0 and len(ids) >= self.max_new_tokens
        turn = episode.first_turn(s) + sample.turns_before(n)
        texts = episode.texts
        text = (
            texts[turn]
            if texts is not None and turn < len(texts)
            else self.tokenizer.decode(ids, skip_special_tokens=True)
        )
        return Action(text=text, token_ids=ids, logprobs=logprobs, stopped=not cut)

    def fingerprint(self) -> dict[str, Any]:
        return {**self._identity(), "episodes": len(self.episodes)}


__all__ = ["ReplayDiverged", "StoredEpisode", "StoredSample", "StoredTokensAgent", "stored_episode"]
