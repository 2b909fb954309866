"""Token-exact multi-turn conversations built by appending deltas.

Re-rendering the whole conversation with the chat template every turn is the
most reported bug family in RL rollout code: templates that are not
prefix-preserving (Qwen3 drops past ``<think>`` blocks, Mistral moves the system
prompt, some add BOS each render) silently change the ids the model already saw,
so the stored sequence no longer matches what was sampled. :class:`ChatDelta`
never does that. The first prompt is rendered once; after that, each turn appends
the agent's ids and then a *delta*: the template applied to a fixed dummy context
plus the new message, minus the dummy context's own rendering. The delta renders
and tokenizes a constant-size text, so tokenization work grows linearly with
the episode, not with turns × history.

The rules, all read as "what would the model have seen, given that it sampled these ids":

1. **Agent ids are stored unchanged.** A token-level agent's ids (analysis channel,
   reasoning, tool call, whatever it sampled) are never re-tokenized or edited.
2. **After a sampled end token, append only what the template writes after that
   turn's end marker**, whichever end token the model chose. The *end marker* of a
   past assistant turn is the optional whitespace plus the first special token that
   follows its content in the template (``<|im_end|>``, ``<|eot_id|>``, gpt-oss's
   ``<|end|>``, Llama-2's ``" </s>"``). So gpt-oss ``…<|return|>`` continues
   ``<|start|>user…`` (never ``<|return|><|end|>``), Llama-3 ``…<|eom_id|>`` continues
   ``<|start_header_id|>user…``, Gemma ``…<eos>`` continues ``\\n<start_of_turn>user``,
   and Llama-2 ``…</s>`` continues ``<s>[INST]…`` (no second ``" </s>"``).
3. **A turn cut by the token budget** (no end token sampled) gets the template's
   whole closing, end marker included, as environment tokens.
4. **A text-only agent's turn** is stored as the ids a model would have sampled to
   say that text: the template's *opening* of a past assistant turn (the text it
   writes between the generation prompt and the content: gpt-oss
   ``<|channel|>final<|message|>``, Llama-2 ``" "``, empty for most), the text, and
   the template's *end token* (the first special token closing an assistant turn
   that is the last message: ``<|im_end|>``, gpt-oss ``<|return|>``). All of it is agent
   tokens (not sampled ones), so a trainer also learns to emit the end token.
5. **Environment text is data, never control.** Special-token strings inside env
   messages and the system prompt (``<|end|><|assistant|>``) are tokenized as plain
   text, so an env cannot forge a turn; the template's own framing keeps its special
   ids. (Agent text from text-only agents is tokenized normally.)
6. **Template options**: ``template_kwargs`` (``enable_thinking``, ``reasoning_effort``,
   ``date_string``, ...) go to every render; ``tools`` go to the first render only,
   where every template puts them (system/developer block, first user message, or
   for Mistral the last user message at that time), so they appear once.

Where a full re-render of the final conversation differs from the stored ids, the
template rewrites history; :func:`check_chat_template` names the known cases
(dropped reasoning, moved system prompt, end token rewritten, whitespace trimmed)
and flags anything else as a defect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from transformers import PreTrainedTokenizerBase

from .types import Message

_DUMMY_USER = "\u2063u"  # rare characters, so they cannot collide with template text
_DUMMY_ASSISTANT = "\u2063a"
_DUMMY_USER2 = "\u2063v"
_GUARD_OPEN, _GUARD_CLOSE = "\ue000", "\ue001"  # private-use: marks a protected literal in env text
_GUARD = re.compile(f"{_GUARD_OPEN}(\\d+){_GUARD_CLOSE}")
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
    stored is ever re-tokenized. See the module docstring for the rules.

    Args:
        template_kwargs: extra keyword options for every ``apply_chat_template`` call.
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
            tools = self.template_kwargs.pop("tools")
            self.tools = self.tools or tools
        bad = sorted(_RESERVED_KWARGS & set(self.template_kwargs))
        if bad:
            raise ChatTemplateError(f"chat_template_kwargs may not set {bad}: ChatDelta controls those.")
        if self.tools is not None and not (
            isinstance(self.tools, list) and all(isinstance(t, dict) for t in self.tools)
        ):
            raise ChatTemplateError("tools must be a list of JSON-schema dicts, e.g. [{'type': 'function', ...}].")

    # -- rendering and tokenizing -------------------------------------------
    def render(self, messages: list[Message], add_generation_prompt: bool, *, tools: list | None = None) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools, **self.template_kwargs
        )

    def encode(self, text: str) -> list[int]:
        """Tokenize raw text (special-token strings in it become special ids), adding nothing."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_plain(self, text: str) -> list[int]:
        """Tokenize ``text`` with special-token strings spelled out as ordinary text."""
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    @cached_property
    def _specials(self) -> re.Pattern[str]:
        tokens = {t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special}
        tokens |= set(self.tokenizer.all_special_tokens)
        tokens = sorted((t for t in tokens if t), key=len, reverse=True)
        return re.compile("|".join(re.escape(t) for t in tokens) or "(?!)")

    @cached_property
    def _protected(self) -> re.Pattern[str]:
        return re.compile(f"{self._specials.pattern}|{_GUARD_OPEN}")

    @cached_property
    def _special_ids(self) -> frozenset[int]:
        return frozenset(self.tokenizer.all_special_ids)

    def _protect(self, messages: list[Message], literals: list[str]) -> list[Message]:
        """Non-assistant messages with special-token strings (and the guard character) replaced by guards."""
        pattern = self._protected

        def guard(match: re.Match[str]) -> str:
            literals.append(match.group(0))
            return f"{_GUARD_OPEN}{len(literals) - 1}{_GUARD_CLOSE}"

        return [
            m
            if m.get("role") == "assistant" or not isinstance(m.get("content"), str)
            else {**m, "content": pattern.sub(guard, m["content"])}
            for m in messages
        ]

    def _encode_guarded(self, text: str, literals: list[str]) -> list[int]:
        """Encode rendered text: template framing with special ids, guarded literals as plain text."""
        if not literals:
            return self.encode(text)
        ids: list[int] = []
        at = 0
        for match in _GUARD.finditer(text):
            if match.start() > at:
                ids += self.encode(text[at : match.start()])
            ids += self.encode_plain(literals[int(match.group(1))])
            at = match.end()
        return ids + (self.encode(text[at:]) if at < len(text) else [])

    def _first_special(self, text: str) -> str | None:
        """The special token ``text`` starts with, after optional whitespace; else ``None``."""
        match = self._specials.search(text)
        return match.group(0) if match and not text[: match.start()].strip() else None

    # -- the template's assistant framing -----------------------------------
    @cached_property
    def _dummy_context(self) -> list[Message]:
        return [{"role": "user", "content": _DUMMY_USER}, {"role": "assistant", "content": _DUMMY_ASSISTANT}]

    @cached_property
    def framing(self) -> AssistantFraming:
        """The template's assistant framing (see :class:`AssistantFraming`), read from three renders."""
        prompt = self.render(self._dummy_context[:1], add_generation_prompt=True)
        history = self.render(self._dummy_context + [{"role": "user", "content": _DUMMY_USER2}], True)
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
            after_user = history[history.find(_DUMMY_USER2) + len(_DUMMY_USER2) :]
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
        listed in its ``generation_config.eos_token_id``).
        """
        if not agent_ids:
            return False
        last = agent_ids[-1]
        return last in self.end_token_ids or (stopped and last in self._special_ids)

    # -- the pieces of an episode ---------------------------------------------
    def initial_ids(self, messages: list[Message]) -> list[int]:
        """Ids of the opening messages (with ``tools``), ending with the generation prompt."""
        literals: list[str] = []
        text = self.render(self._protect(messages, literals), add_generation_prompt=True, tools=self.tools)
        return self._encode_guarded(text, literals)

    def assistant_turn_ids(self, text: str, stopped: bool = True) -> list[int]:
        """Ids a model would have sampled to answer ``text`` (rule 4): opening, text, and end token if ``stopped``."""
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
        new = self._protect([{"role": role, "content": content}], literals)
        rendered = self.render(self._dummy_context + new, add_generation_prompt=True)
        at = rendered.find(_DUMMY_ASSISTANT)
        if at < 0:
            raise ChatTemplateError(
                "The chat template drops past assistant messages; it cannot be used for multi-turn rollouts."
            )
        ended = self.turn_ended(agent_ids) if ended is None else ended
        return self._encode_guarded(self._after_end(rendered[at + len(_DUMMY_ASSISTANT) :], ended), literals)


# -- a check users can run on their model's template ---------------------------------------
_CHECK_SYSTEM = "Answer in few words."
_CHECK_USERS = ("Guess my number.", "Higher.", "Lower.")
_CHECK_ANSWERS = ("Is it 3?", "Is it 7?")
_CHECK_REASONING = "<think>\nThe number may be 3.\n</think>\n\n"


@dataclass(frozen=True)
class TemplateFinding:
    """One difference between the delta-built ids and a full render of the same conversation.

    ``kind``: ``"rewrite"`` (the template rewrites history in a known way; the stored ids keep
    what the model saw), ``"note"`` (not a difference in content: unsupported roles, or
    pieces tokenized apart that a full render tokenizes together), or ``"defect"`` (deltas
    differ from the render for no known reason: do not train on this template without a look).
    """

    kind: str
    rule: str
    detail: str


@dataclass
class TemplateReport:
    """What :func:`check_chat_template` found; ``str(report)`` prints it."""

    framing: AssistantFraming
    stop_tokens: list[str]
    findings: list[TemplateFinding]

    @property
    def rewrites(self) -> list[str]:
        return [f.rule for f in self.findings if f.kind == "rewrite"]

    @property
    def defects(self) -> list[TemplateFinding]:
        return [f for f in self.findings if f.kind == "defect"]

    @property
    def ok(self) -> bool:
        return not self.defects

    def __str__(self) -> str:
        f = self.framing
        lines = [
            f"assistant opening {f.opening!r}, end token {f.end_token!r}, history end marker {f.history_end!r}",
            f"stop tokens (plus the model's generation_config eos): {self.stop_tokens}",
        ]
        lines += [f"{x.kind.upper():8} {x.rule}: {x.detail}" for x in self.findings]
        lines.append("OK: deltas agree with the full render except where noted" if self.ok else "DEFECTS found")
        return "\n".join(lines)


def check_chat_template(
    tokenizer: PreTrainedTokenizerBase, *, tools: list[dict[str, Any]] | None = None, **template_kwargs: Any
) -> TemplateReport:
    """Play short scripted conversations through :class:`ChatDelta` and compare with full renders.

    Four conversations (plain; with a system prompt; answers with ``<think>`` reasoning;
    answers with surrounding whitespace) are built as the recorder builds episodes, with the
    end marker of each past turn written in the template's history form, and compared token
    by token with ``apply_chat_template`` of the whole conversation. Each differing region is
    classified: reasoning dropped (Qwen3, DeepSeek-R1), system prompt moved (Mistral),
    end token rewritten in history (gpt-oss ``<|return|>`` → ``<|end|>``, Llama-2 ``</s>`` →
    ``" </s>"``), whitespace trimmed (Llama, Gemma), or else a defect.
    """
    import difflib

    chat = ChatDelta(tokenizer, template_kwargs, tools)
    f = chat.framing
    findings: list[TemplateFinding] = []
    if f.end_token is not None and f.history_end != f.end_token:
        findings.append(
            TemplateFinding(
                "rewrite",
                "end token rewritten in history",
                f"the model ends its turn with {f.end_token!r}, past turns show {f.history_end!r}; stored ids keep "
                "the sampled token and continue with what follows the end marker",
            )
        )
    variants = {
        "plain": (False, list(_CHECK_ANSWERS)),
        "system": (True, list(_CHECK_ANSWERS)),
        "reasoning": (False, [_CHECK_REASONING + a for a in _CHECK_ANSWERS]),
        "whitespace": (False, [f"  {a}\n" for a in _CHECK_ANSWERS]),
    }
    for label, (system, answers) in variants.items():
        msgs: list[Message] = [{"role": "system", "content": _CHECK_SYSTEM}] if system else []
        for user, answer in zip(_CHECK_USERS, [*answers, None]):
            msgs.append({"role": "user", "content": user})
            if answer is not None:
                msgs.append({"role": "assistant", "content": answer})
        try:
            start = 2 if system else 1
            history = chat.initial_ids(msgs[:start])
            for i in range(start, len(msgs), 2):
                turn = chat.assistant_turn_ids(msgs[i]["content"])
                history += turn[: -1 if f.end_token else None] + chat.encode(f.history_end)
                history += chat.user_delta_ids(msgs[i + 1]["content"], turn)
            full = chat.encode(chat.render(msgs, add_generation_prompt=True, tools=tools))
        except Exception as exc:  # a template that refuses the conversation
            kind = "note" if system else "defect"
            findings.append(TemplateFinding(kind, f"{label} conversation fails", f"{type(exc).__name__}: {exc}"))
            continue
        once = tokenizer.decode(history).count(_CHECK_SYSTEM) == tokenizer.decode(full).count(_CHECK_SYSTEM) == 1
        ops = difflib.SequenceMatcher(None, history, full, autojunk=False).get_opcodes()
        for op, i1, i2, j1, j2 in ops:
            if op != "equal":
                stored_text, full_text = tokenizer.decode(history[i1:i2]), tokenizer.decode(full[j1:j2])
                findings.append(_classify(stored_text, full_text, label, once))
    unique = list(dict.fromkeys(findings))
    seen: set[tuple[str, str]] = set()
    findings = [x for x in unique if (x.kind, x.rule) not in seen and not seen.add((x.kind, x.rule))]
    return TemplateReport(f, tokenizer.convert_ids_to_tokens(list(chat.stop_token_ids)), findings)


def _classify(stored: str, full: str, label: str, system_once: bool) -> TemplateFinding:
    """Name the rewrite that explains one differing region (``stored``: the deltas, ``full``: a full render;
    ``system_once``: both whole sequences hold the system prompt exactly once)."""
    where = f"{label} conversation: deltas give {stored!r}, a full render gives {full!r}"
    if stored == full:
        return TemplateFinding("note", "tokenized apart", f"same text, other ids at a piece boundary ({where})")
    if ("The number may be" in stored or "<think>" in stored) and "The number may be" not in full:
        return TemplateFinding("rewrite", "reasoning dropped from history", where)
    if (
        system_once
        and (_CHECK_SYSTEM in stored) != (_CHECK_SYSTEM in full)
        and (stored.replace(_CHECK_SYSTEM, "").strip() == full.replace(_CHECK_SYSTEM, "").strip())
    ):
        return TemplateFinding("rewrite", "system prompt moved", where)
    if label == "whitespace" and "".join(stored.split()) == "".join(full.split()):
        return TemplateFinding("rewrite", "whitespace trimmed in history", where)
    return TemplateFinding("defect", "unexplained difference", where)
