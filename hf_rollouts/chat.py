"""Token-exact multi-turn conversations built by appending deltas.

Re-rendering the whole conversation with the chat template every turn is the
most reported bug family in RL rollout code: templates that are not
prefix-preserving (Qwen3 drops past ``<think>`` blocks, some add BOS each
render) silently change the ids the model already saw, so the stored sequence
no longer matches what was sampled. :class:`ChatDelta` never does that. The
first prompt is rendered once; after that, each turn appends

1. the agent's sampled ids, unchanged;
2. the rest of the template's end-of-assistant-turn text (for example ``"\\n"``
   after Qwen's ``<|im_end|>``, or the whole closing text if the agent hit its
   token budget before sampling the end-of-turn token);
3. the new environment message rendered *as a delta*: the template applied to a
   fixed two-message dummy context plus the new message, minus the dummy
   context's own rendering.

Step 3 renders and tokenizes a constant-size text, so the tokenization work of
an episode grows linearly with its length, not with turns × history.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from transformers import PreTrainedTokenizerBase

from .types import Message

_DUMMY_USER = "\u2063u"  # rare characters, so they cannot collide with template text
_DUMMY_ASSISTANT = "\u2063a"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used for delta rendering."""


@dataclass
class ChatDelta:
    """Renders conversation pieces to token ids with ``tokenizer``'s chat template.

    Contract: for a conversation built with :meth:`initial_ids` followed by any
    number of (agent ids, :meth:`user_delta_ids`) pairs, the concatenation is
    exactly the ids an agent is conditioned on at each turn; nothing already
    stored is ever re-tokenized.
    """

    tokenizer: PreTrainedTokenizerBase

    def __post_init__(self) -> None:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ChatTemplateError(
                f"Tokenizer {type(self.tokenizer).__name__} ({self.tokenizer.name_or_path!r}) has no chat_template. "
                "Use an instruct/chat model's tokenizer or set tokenizer.chat_template before building the env."
            )
        if self.tokenizer.pad_token_id is None:
            raise ChatTemplateError(
                f"Tokenizer {self.tokenizer.name_or_path!r} has no pad_token_id, which padding needs. "
                "Set one, e.g. `tokenizer.pad_token = tokenizer.eos_token`."
            )

    def render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Tokenize raw text (special-token strings in it become special ids), adding nothing."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def initial_ids(self, messages: list[Message]) -> list[int]:
        """Ids of the opening messages, ending with the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    @cached_property
    def _dummy_context(self) -> list[Message]:
        return [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": _DUMMY_ASSISTANT}]

    @cached_property
    def _dummy_render(self) -> str:
        return self.render(self._dummy_context, add_generation_prompt=False)

    @cached_property
    def assistant_closing(self) -> str:
        """Template text that follows an assistant message's content (e.g. ``"<|im_end|>\\n"``)."""
        rendered = self._dummy_render
        at = rendered.rfind(_DUMMY_ASSISTANT)
        if at < 0:
            raise ChatTemplateError(
                "The chat template drops assistant messages; it cannot be used for multi-turn rollouts."
            )
        return rendered[at + len(_DUMMY_ASSISTANT) :]

    @cached_property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: the eos id(s), plus the closing's first token when it is special."""
        ids: list[int] = []
        eos = self.tokenizer.eos_token_id
        ids.extend(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
        closing = self.encode(self.assistant_closing)
        if closing and closing[0] in self.tokenizer.all_special_ids and closing[0] not in ids:
            ids.append(closing[0])
        return tuple(ids)

    def closing_rest(self, agent_ids: list[int]) -> str:
        """What must follow the agent's ids to close its turn in template form.

        If the agent sampled an end-of-turn token that the closing text starts
        with, only the remainder is needed; otherwise the whole closing.
        """
        return self._after_sampled_stop(self.assistant_closing, agent_ids)

    def _after_sampled_stop(self, text: str, agent_ids: list[int]) -> str:
        """``text`` minus the end-of-turn token the agent already sampled, if it starts with it."""
        if agent_ids and agent_ids[-1] in self.stop_token_ids:
            stop_text = self.tokenizer.convert_ids_to_tokens(agent_ids[-1])
            if text.startswith(stop_text):
                return text[len(stop_text) :]
        return text

    def user_delta_ids(self, content: str, agent_ids: list[int], role: str = "user") -> list[int]:
        """Ids that close the agent's turn and add one new ``role`` message plus the generation prompt.

        The delta is read from one render of ``[dummy user, dummy assistant, new message]``:
        everything after the dummy assistant's content, i.e. the closing of an assistant turn
        *that is no longer the last one* (templates such as Qwen3's render the last assistant
        turn differently), the new message, and the generation prompt.
        """
        with_user = self.render(self._dummy_context + [{"role": role, "content": content}], add_generation_prompt=True)
        at = with_user.find(_DUMMY_ASSISTANT)
        if at < 0:
            raise ChatTemplateError(
                "The chat template drops past assistant messages; it cannot be used for multi-turn rollouts."
            )
        return self.encode(self._after_sampled_stop(with_user[at + len(_DUMMY_ASSISTANT) :], agent_ids))
