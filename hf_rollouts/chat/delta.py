""":class:`ChatDelta`: the pieces of a token-exact episode, read from a chat template (rules 1-4 and 6 of
:mod:`hf_rollouts.chat`), and the template's assistant framing they rest on."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..types import Message
from . import guard

# probe texts for the deltas of a render (rare characters, so they cannot collide with template text; tool_turns
# uses them too)
PROBE_USER = "\u2063u"
_DUMMY_ASSISTANT = "\u2063a"
PROBE_USER2 = "\u2063v"
_RESERVED_KWARGS = frozenset(
    "conversation messages tokenize add_generation_prompt continue_final_message return_dict "
    "return_assistant_tokens_mask chat_template documents".split()
)


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used for delta rendering."""


@dataclass(frozen=True)
class AssistantFraming:
    """What a template writes around an assistant message (read from dummy renders).

    Attributes:
        opening: text between the generation prompt and a past assistant turn's content.
        end_token: special token that ends an assistant turn rendered last (what a model
            samples to finish; ``None`` if the template writes none).
        history_end: the end marker after a past assistant turn's content (whitespace plus
            an end-of-turn special token), dropped after a sampled end token; ``""`` if none.
        closing_last: the whole text after a last assistant turn's content.
    """

    opening: str
    end_token: str | None
    history_end: str
    closing_last: str


@dataclass
class ChatDelta:
    """Renders conversation pieces to token ids with ``tokenizer``'s chat template.

    Contract: for a conversation built with :meth:`initial_ids` followed by any
    number of (agent ids, :meth:`user_delta_ids`) pairs, the concatenation is
    exactly the ids an agent is conditioned on at each turn; nothing already
    stored is ever re-tokenized. See :mod:`hf_rollouts.chat` for the rules.

    Args:
        template_kwargs: extra keyword options for every ``apply_chat_template`` call. A
            ``"tools"`` entry is taken as ``tools`` (it is ``apply_chat_template``'s keyword);
            giving tools both ways raises :class:`ChatTemplateError`.
        tools: JSON schemas of the episode's tools, rendered into the first prompt.
    """

    tokenizer: PreTrainedTokenizerBase
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None

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
        if not isinstance(self.template_kwargs, dict):
            raise ChatTemplateError(f"chat_template_kwargs must be a dict, got {type(self.template_kwargs).__name__}.")
        self.template_kwargs = dict(self.template_kwargs)
        if "tools" in self.template_kwargs:  # accepted there too: it is apply_chat_template's keyword
            if self.tools is not None:
                raise ChatTemplateError(
                    "tools were given twice: as `tools` (an env's `_tools()`) and as chat_template_kwargs['tools']. "
                    "Give them in one place: return them from the env's `_tools()` hook (or pass `tools=`), "
                    "and drop 'tools' from chat_template_kwargs."
                )
            self.tools = self.template_kwargs.pop("tools")
        bad = sorted(_RESERVED_KWARGS & set(self.template_kwargs))
        if bad:
            raise ChatTemplateError(f"chat_template_kwargs may not set {bad}: ChatDelta controls those.")
        if self.tools is not None and not (
            isinstance(self.tools, list) and all(isinstance(t, dict) for t in self.tools)
        ):
            raise ChatTemplateError("tools must be a list of JSON-schema dicts, e.g. [{'type': 'function', ...}].")

    # -- rendering and tokenizing -------------------------------------------
    def render(self, messages: list[Message], add_generation_prompt: bool, *, tools: list | None = None) -> str:
        """``apply_chat_template`` of ``messages`` as text. Without ``tools`` only where the template renders
        without them: one that raises without them but not with them (Hermes-2-Pro loops over ``tools`` unguarded)
        gets the chat's tools in every render."""
        if tools is None and self._needs_tools:
            tools = self.tools
        return self._apply(messages, add_generation_prompt, tools)

    def _apply(self, messages: list[Message], add_generation_prompt: bool, tools: list | None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools, **self.template_kwargs
        )

    @cached_property
    def _needs_tools(self) -> bool:
        """Whether a render without ``tools`` raises where one with the chat's tools does not."""
        if not self.tools:
            return False
        probe: list[Message] = [{"role": "user", "content": PROBE_USER}]
        try:
            self._apply(probe, True, None)
        except Exception:
            self._apply(probe, True, self.tools)  # raises itself if tools do not help either
            return True
        return False

    def encode(self, text: str) -> list[int]:
        """Tokenize raw text (special-token strings in it become special ids), adding nothing."""
        return guard.encode(self.tokenizer, text)

    def encode_plain(self, text: str) -> list[int]:
        """Tokenize ``text`` with special-token strings spelled out as ordinary text."""
        return guard.encode_plain(self.tokenizer, text)

    @cached_property
    def _specials(self) -> re.Pattern[str]:
        return guard.specials_pattern(self.tokenizer)

    @cached_property
    def _protected(self) -> re.Pattern[str]:
        return guard.protected_pattern(self._specials)

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return guard.special_ids(self.tokenizer)

    def _render_guarded(self, messages: list[Message], add_generation_prompt: bool, **kwargs: Any) -> list[int]:
        """Render ``messages`` and encode them, special-token strings in non-assistant content as plain text."""
        literals: list[str] = []
        text = self.render(guard.protect(messages, self._protected, literals), add_generation_prompt, **kwargs)
        return guard.encode_guarded(self.tokenizer, text, literals)

    def _first_special(self, text: str) -> str | None:
        """The special token ``text`` starts with, after optional whitespace; else ``None``."""
        match = self._specials.search(text)
        return match.group(0) if match and not text[: match.start()].strip() else None

    # -- the template's assistant framing -----------------------------------
    @cached_property
    def _dummy_context(self) -> list[Message]:
        return [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": _DUMMY_ASSISTANT}]

    @cached_property
    def framing(self) -> AssistantFraming:
        """The template's assistant framing (see :class:`AssistantFraming`), read from three renders."""
        prompt = self.render(self._dummy_context[:1], add_generation_prompt=True)
        history = self.render(self._dummy_context + [{"role": "user", "content": PROBE_USER2}], True)
        last = self.render(self._dummy_context, add_generation_prompt=False)
        at = history.find(_DUMMY_ASSISTANT)
        if at < 0 or _DUMMY_ASSISTANT not in last:
            raise ChatTemplateError(
                "The chat template drops assistant messages; it cannot be used for multi-turn rollouts."
            )
        opening = history[len(prompt) : at] if history.startswith(prompt) and len(prompt) <= at else ""
        closing_last = last[last.rfind(_DUMMY_ASSISTANT) + len(_DUMMY_ASSISTANT) :]
        end_token = self._first_special(closing_last)
        after = history[at + len(_DUMMY_ASSISTANT) :]
        history_end = ""
        candidate = self._first_special(after)
        if candidate is not None:
            # an end-of-turn token: a stop id, or the token that also closes user messages but does not open turns
            bare_prompt = self.render(self._dummy_context[:1], add_generation_prompt=False)
            gen_prompt = prompt[len(bare_prompt) :] if prompt.startswith(bare_prompt) else ""
            after_user = history[history.find(PROBE_USER2) + len(PROBE_USER2) :]
            stops = {self.tokenizer.convert_ids_to_tokens(i) for i in self._eos_ids} | {end_token}
            if candidate in stops or (
                self._first_special(after_user) == candidate and self._first_special(gen_prompt) != candidate
            ):
                history_end = after[: after.index(candidate) + len(candidate)]
        return AssistantFraming(opening, end_token, history_end, closing_last)

    @property
    def assistant_closing(self) -> str:
        """Template text that follows the content of an assistant turn rendered last."""
        return self.framing.closing_last

    @cached_property
    def _eos_ids(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return list(eos) if isinstance(eos, list) else ([eos] if eos is not None else [])

    def _token_id(self, token: str | None) -> list[int]:
        return [] if token is None else [self.tokenizer.convert_tokens_to_ids(token)]

    @cached_property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation: the eos id(s) and the template's end token.

        Agents add the model's own ``generation_config.eos_token_id``. Not the history end
        marker when it differs (gpt-oss ``<|end|>`` also ends an analysis message, after
        which the model continues with its final answer).
        """
        return tuple(dict.fromkeys(self._eos_ids + self._token_id(self.framing.end_token)))

    @cached_property
    def end_token_ids(self) -> tuple[int, ...]:
        """Ids that, as an agent turn's last id, mean the turn ended: stops plus the history end token."""
        marker = self._first_special(self.framing.history_end) if self.framing.history_end else None
        return tuple(dict.fromkeys(self.stop_token_ids + tuple(self._token_id(marker))))

    def turn_ended(self, agent_ids: list[int], stopped: bool = False) -> bool:
        """Whether ``agent_ids`` end with a sampled end token (rule 2) rather than being cut (rule 3).

        True when the last id is one of :attr:`end_token_ids`, or when the agent reports
        ``stopped`` and its last id is a special token (a model's own stop, such as an id
        listed in its ``generation_config.eos_token_id``; any added token marked special
        counts, listed in a special-token list or not, see :mod:`hf_rollouts.chat.guard`).
        """
        if not agent_ids:
            return False
        last = agent_ids[-1]
        return last in self.end_token_ids or (stopped and last in self._special_ids)

    # -- the pieces of an episode ---------------------------------------------
    def initial_ids(self, messages: list[Message]) -> list[int]:
        """Ids of the opening messages (with ``tools``), ending with the generation prompt."""
        return self._render_guarded(messages, True, tools=self.tools)

    def assistant_turn_ids(self, text: str, stopped: bool = True) -> list[int]:
        """Ids a model would have sampled to answer ``text`` (rule 4): opening, text, and end token if ``stopped``.

        No end token is appended when the text's own ids already end with an end token.
        """
        ids = self.encode(self.framing.opening + text)
        if stopped and not (ids and ids[-1] in self.end_token_ids):
            ids += self._token_id(self.framing.end_token)
        return ids

    def _after_end(self, text: str, ended: bool) -> str:
        marker = self.framing.history_end
        return text[len(marker) :] if ended and marker and text.startswith(marker) else text

    def user_delta_ids(
        self, content: str, agent_ids: list[int], role: str = "user", *, ended: bool | None = None
    ) -> list[int]:
        """Ids that close the agent's turn and add one new ``role`` message plus the generation prompt.

        The delta is read from one render of ``[dummy user, dummy assistant, new message]``:
        everything after the dummy assistant's content, i.e. the closing of an assistant turn
        *that is no longer the last one* (rule 2 or 3), the new message (rule 5), and the
        generation prompt. ``ended`` overrides :meth:`turn_ended`'s reading of ``agent_ids``.
        """
        literals: list[str] = []
        new = guard.protect([{"role": role, "content": content}], self._protected, literals)
        rendered = self.render(self._dummy_context + new, add_generation_prompt=True)
        at = rendered.find(_DUMMY_ASSISTANT)
        if at < 0:
            raise ChatTemplateError(
                "The chat template drops past assistant messages; it cannot be used for multi-turn rollouts."
            )
        ended = self.turn_ended(agent_ids) if ended is None else ended
        after = self._after_end(rendered[at + len(_DUMMY_ASSISTANT) :], ended)
        return guard.encode_guarded(self.tokenizer, after, literals)
