"""The sample: one stored token sequence of an episode (the contract of :class:`Sample`).

An episode (:class:`hf_rollouts.types.Episode`) is one or more samples. A sample is exactly what the model
conditioned on and sampled, call after call: each call's prompt is a prefix of the sample's stored ids. A model call
whose prompt extends the current sample (:func:`extends`: the stored ids are a prefix of the new prompt) joins it,
the new prompt's tail entering as env tokens and the sampled ids as agent tokens; a call that does not (the program
edited or compacted its history, or the chat template rewrote it) closes the sample and starts a new one whose env
tokens are the whole new prompt. Samples are consecutive runs of calls. The recorder applies the rule
(:meth:`hf_rollouts.rollout.recorder.EpisodeRecorder.add_call`); docs/concepts/token-exactness.md tells the story.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Sample", "check_sequence", "extends"]


def extends(prompt: Sequence[int], stored: Sequence[int]) -> bool:
    """Whether ``prompt`` extends ``stored``: ``stored`` is a prefix of it (a call with this prompt joins the
    sample whose ids are ``stored``; an empty ``stored`` is extended by every prompt)."""
    n = len(stored)
    return len(prompt) >= n and list(prompt[:n]) == list(stored)


def check_sequence(seq: Any, where: str = "episode") -> None:
    """Raise ``AssertionError`` (naming ``where``) if one stored token sequence (a :class:`Sample`, or an
    :class:`~hf_rollouts.types.Episode`'s own fields) breaks the per-token invariants: equal lengths, sampled marks
    and rewards only on agent tokens, one log-prob per token (or none)."""
    ids, agent, sampled, rewards = (
        seq.full_token_ids,
        seq.agent_token_mask,
        seq.sampled_token_mask,
        seq.per_token_rewards,
    )
    n = len(ids)
    assert len(agent) == n and len(rewards) == n and len(sampled) == n, f"{where}: per-token lists differ in length"
    assert all(m or not s for m, s in zip(agent, sampled)), f"{where}: sampled mark on a non-agent token"
    assert seq.logprobs is None or len(seq.logprobs) == n, f"{where}: {len(seq.logprobs)} logprobs for {n} tokens"
    for m, r in zip(agent, rewards):
        assert m == 1 or r == 0.0, f"{where}: reward on a non-agent token"


@dataclass(frozen=True)
class Sample:
    """One stored token sequence of an episode: exactly what the model conditioned on and sampled, call after call.

    Each model call of the sample was conditioned on a prefix of ``full_token_ids`` (the calls' prompts extend one
    another); the per-token fields mean what they mean on :class:`Episode`. An episode whose calls always extend
    its stored sequence (every env played append-only) has one sample, held by the :class:`Episode`'s own fields; a
    call whose prompt does not extend the current sample (the program edited or compacted its history, or the chat
    template rewrote it) closes it and starts a new one (see :meth:`hf_rollouts.rollout.recorder.EpisodeRecorder.
    add_call`). Closed samples are kept in ``Episode.earlier_samples``.

    Attributes:
        full_token_ids: the sample's ids (prompts, env deltas, sampled ids).
        agent_token_mask: 1 on the agent's tokens.
        sampled_token_mask: 1 where the id is exactly what the agent reported sampling.
        per_token_rewards: the step rewards of the sample's calls, on their agent tokens only.
        logprobs: sampling log-probabilities (0.0 off agent tokens), or ``None`` when the agent gave none.
        num_calls: the model calls (agent turns) the sample holds.
    """

    full_token_ids: list[int]
    agent_token_mask: list[int]
    sampled_token_mask: list[int]
    per_token_rewards: list[float]
    logprobs: list[float] | None
    num_calls: int

    def check(self, where: str = "sample") -> None:
        """Raise ``AssertionError`` if a per-token invariant is broken, or the sample holds no call."""
        check_sequence(self, where)
        assert self.num_calls >= 1, f"{where}: a sample holds at least one call, got num_calls={self.num_calls}"
