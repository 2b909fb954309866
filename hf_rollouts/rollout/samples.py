"""The calls of one episode, split into samples; what a call hands over, checked.

An episode is one or more samples (:mod:`hf_rollouts.sample`): :meth:`~.recorder.EpisodeRecorder.add_call` keeps a
call in the current sample when its prompt extends the sample's stored ids, and otherwise closes the sample here
(:class:`SampleSplit`) and starts a new one.

**Template modes** (:data:`TEMPLATE_MODES`, an env's ``template_mode`` config key). ``"append"`` (the default) builds
each turn's prompt by appending: the stored ids, the sampled ids, then only the new env message rendered as a delta
(:class:`~hf_rollouts.chat.ChatDelta`), so an episode is one sample whatever the template does to history.
``"render"`` plays each turn as a deployed model sees it: the prompt is the chat template's full render of the
conversation so far (:func:`full_render`: ``apply_chat_template(messages, tools, add_generation_prompt=True)``), and
each call is recorded through ``add_call``, so an episode branches into a new sample wherever the template rewrites
history (Qwen3 and DeepSeek-R1 drop the reasoning of earlier turns).

:func:`check_action` and :func:`check_prompt_ids` refuse what an agent hands over that cannot be stored, before
anything is recorded (:class:`AgentOutputError`).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from ..chat import ChatDelta
from ..chat.tool_turns import template_messages
from ..sample import Sample
from ..types import Action, Message, is_number

TEMPLATE_MODES = ("append", "render")
"""How an env's turns become prompts (see the module docstring)."""


class AgentOutputError(ValueError):
    """The agent handed over something that cannot be stored as an action."""


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: a value in an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def full_render(chat: ChatDelta, messages: list[Message]) -> list[int]:
    """The ids of the chat template's render of the whole conversation ``messages`` (the chat's tools and template
    options included), ending with the generation prompt; env text cannot inject control tokens (the guard of
    :meth:`~hf_rollouts.chat.ChatDelta.initial_ids`)."""
    return chat.initial_ids(template_messages(messages))


class SampleSplit:
    """The closed samples of one episode and the turn where the current sample began."""

    def __init__(self) -> None:
        self.earlier: list[Sample] = []
        self.first_turn = 0  # index in the recorder's turns of the current sample's first call

    def close(self, rec: Any, num_turns: int) -> None:
        """Close the current sample of recorder ``rec`` (its ids, masks, rewards and log-probs as they stand), which
        holds the turns from :attr:`first_turn` to ``num_turns``; an empty one (no ids yet) is not kept."""
        if rec.ids:
            logprobs = rec.logprobs if rec.any_logprobs else None
            self.earlier.append(
                Sample(rec.ids, rec.mask, rec.sampled, rec.rewards, logprobs, num_turns - self.first_turn)
            )
        self.first_turn = num_turns

    def calls(self, num_turns: int) -> list[int]:
        """``Episode.sample_calls``: calls per sample, the current (last) one holding the turns since
        :attr:`first_turn`; empty for an episode of one sample."""
        if not self.earlier:
            return []
        return [s.num_calls for s in self.earlier] + [num_turns - self.first_turn]

    def copy(self) -> SampleSplit:
        out = SampleSplit()
        out.earlier, out.first_turn = list(self.earlier), self.first_turn
        return out


def message_problem(messages: Any) -> str | None:
    """What makes ``messages`` (a call's readable conversation) unstorable in the ``conversations`` column, or
    ``None``: it must be a list of dicts whose ``role`` is a ``str`` and ``content`` a ``str`` or ``None`` (join a
    request's content parts to text first)."""
    if not isinstance(messages, list):
        return f"messages must be a list of message dicts, got {type(messages).__name__}"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return f"message {i} must be a dict with a str 'role', got {show(m)}"
        if not isinstance(m.get("content"), (str, type(None))):
            return (
                f"message {i}'s content must be a str or None, got {type(m['content']).__name__} {show(m['content'])}"
            )
    return None


def check_prompt_ids(prompt_ids: Any, vocab: int) -> list[int]:
    """``prompt_ids`` as a list of ints, or :class:`AgentOutputError` when it is not a sequence of ids in
    ``[0, vocab)``."""
    if isinstance(prompt_ids, (str, bytes)) or not isinstance(prompt_ids, Sequence):
        raise AgentOutputError(f"a call's prompt must be a list of token ids, got {type(prompt_ids).__name__}.")
    for i, t in enumerate(prompt_ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab:
            raise AgentOutputError(
                f"prompt id {show(t)} ({type(t).__name__}) at position {i} is outside the tokenizer's vocabulary "
                f"[0, {vocab}); record the ids the model was conditioned on, from the env's tokenizer."
            )
    return [int(t) for t in prompt_ids]


def check_action(action: Any, vocab: int) -> None:
    """Raise :class:`AgentOutputError` saying what the agent returned, unless ``action`` can be stored: an
    :class:`~hf_rollouts.types.Action` with ``str`` text, ids in ``[0, vocab)`` and one numeric log-prob per id."""
    if not isinstance(action, Action):
        raise AgentOutputError(
            f"the agent returned {type(action).__name__} {show(action)} instead of an Action; act/act_batch "
            "must answer (Action, agent_state)."
        )
    if not isinstance(action.text, str):
        raise AgentOutputError(
            f"the agent returned action text of type {type(action.text).__name__} ({show(action.text)}); "
            "get_action must return (str or Action, agent_state), with the text as a str."
        )
    if action.token_ids is None:
        return
    for i, t in enumerate(action.token_ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab:
            raise AgentOutputError(
                f"the agent returned token id {show(t)} ({type(t).__name__}) at position {i}, outside the "
                f"tokenizer's vocabulary [0, {vocab}); an agent must use the env's tokenizer and report the ids "
                "it sampled."
            )
    if action.logprobs is not None:
        if len(action.logprobs) != len(action.token_ids):
            raise AgentOutputError(
                f"the agent returned {len(action.token_ids)} token ids but {len(action.logprobs)} "
                "log-probabilities; give exactly one per sampled id."
            )
        bad = next((p for p in action.logprobs if not is_number(p)), None)
        if bad is not None:
            raise AgentOutputError(f"the agent returned a log-probability {show(bad)} that is not a number.")
