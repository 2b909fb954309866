""":func:`check_chat_template`: a check users can run on their model's template before training on it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..types import Message, ToolCall
from .delta import AssistantFraming, ChatDelta
from .tool_calls import ToolTemplateError
from .tool_turns import PROBE_TOOL, ToolTurns, template_messages

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

    A fifth conversation plays a tool turn (user, assistant call, ``tool`` result, answer, user) the way tool
    episodes are built (:mod:`hf_rollouts.chat.tool_turns`) and compares it the same way. A template that
    cannot carry tool turns gets the note "tool turns unsupported" with the reason (tool environments refuse
    it); one that can gets its family's tool rewrites named: tool-call header (gpt-oss) or end token (Llama-3.1)
    rewritten in history, tool calls not rendered in history (SmolLM3), pythonic arguments re-rendered (Llama-3.2,
    Llama-4, ToolACE). A template that raises without ``tools`` (Hermes-2-Pro) is checked with a probe tool list.
    """
    chat = ChatDelta(tokenizer, template_kwargs, tools)
    if tools is None:
        try:
            chat.framing  # noqa: B018
        except Exception:  # a template that renders nothing without tools (Hermes-2-Pro): check it with the probe's
            tools = [PROBE_TOOL]
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
                # the answer's ids without any end token, then the end marker in its history form; the delta
                # then adds only what follows that marker (ended=True), whatever the answer's text ends with
                turn = chat.assistant_turn_ids(msgs[i]["content"], stopped=False)
                history += turn + chat.encode(f.history_end)
                history += chat.user_delta_ids(msgs[i + 1]["content"], turn, ended=True)
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
    findings += _tool_findings(chat)
    unique = list(dict.fromkeys(findings))
    seen: set[tuple[str, str]] = set()
    findings = [x for x in unique if (x.kind, x.rule) not in seen and not seen.add((x.kind, x.rule))]
    return TemplateReport(f, tokenizer.convert_ids_to_tokens(list(chat.stop_token_ids)), findings)


def _find_delta(full_text: str, delta_text: str, start: int) -> int:
    """Where the tool-result delta begins in a full render after ``start``: its whole text, else its longest
    prefix that is there (a template may write a past result with other whitespace than the last one), or -1."""
    for size in range(len(delta_text), 0, -1):
        at = full_text.find(delta_text[:size], start)
        if at >= 0 and (size == len(delta_text) or size >= 8):
            return at
    return -1


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
    if label == "tool" and "".join(stored.split()) == "".join(full.split()):
        # vLLM's Hermes template closes the last result '</tool_response><|im_end|>' but a past one with a newline
        return TemplateFinding("rewrite", "whitespace around tool results rewritten in history", where)
    return TemplateFinding("defect", "unexplained difference", where)


def _tool_findings(chat: ChatDelta) -> list[TemplateFinding]:
    """Play one tool conversation through the deltas and compare it with a full render (see
    :func:`check_chat_template`)."""
    turns = ToolTurns(chat)
    try:
        fmt = turns.check()
    except ToolTemplateError as exc:
        return [TemplateFinding("note", "tool turns unsupported", str(exc))]
    call = ToolCall("lookup", {"key": "a"}, id=fmt.call_id("", 1, 0))
    user: Message = {"role": "user", "content": _CHECK_USERS[0]}
    msgs = [
        user,
        turns.assistant_message("", [call]),
        *turns.tool_messages([call], ["42"]),
        {"role": "assistant", "content": _CHECK_ANSWERS[0]},
        {"role": "user", "content": _CHECK_USERS[1]},
    ]
    schemas = turns.tools
    findings = [TemplateFinding("rewrite", rule, f"{fmt.name} tool calls: {detail}") for rule, detail in fmt.rewrites]
    try:
        full_text = chat.render(template_messages(msgs), add_generation_prompt=True, tools=schemas)
        first = chat.render([user], add_generation_prompt=True, tools=schemas)
        bare = chat.render([user], add_generation_prompt=False, tools=schemas)
        if not full_text.startswith(bare):  # Mistral renders the tool list before the LAST user message
            findings.append(
                TemplateFinding(
                    "rewrite",
                    "tool list moved to the last user turn",
                    "stored ids keep it in the first prompt, where the model saw it; compared without it",
                )
            )
            full_text = chat.render(template_messages(msgs), add_generation_prompt=True)
            first = chat.render([user], add_generation_prompt=True)
            bare = chat.render([user], add_generation_prompt=False)
        start = len(first) if full_text.startswith(first) else len(bare)  # a generation prompt kept only in the ids
        delta_text, _, _ = turns._delta_text([call], ["42"], fmt)
        at = _find_delta(full_text, delta_text, start)
        if at < 0:
            raise ValueError("the tool result delta is not found in a full render after the first prompt")
        call_turn = chat.encode(full_text[start:at])  # the call turn as the template writes it in history
        if "lookup" not in full_text[start:at]:
            findings.append(
                TemplateFinding("rewrite", "tool calls not rendered in history", "stored ids keep the sampled calls")
            )
        answer = chat.assistant_turn_ids(_CHECK_ANSWERS[0], stopped=False)
        history = chat.encode(first) + call_turn + turns.result_ids([call], ["42"]) + answer
        history += chat.encode(chat.framing.history_end) + chat.user_delta_ids(_CHECK_USERS[1], answer, ended=True)
        full = chat.encode(full_text)
    except Exception as exc:
        return [*findings, TemplateFinding("defect", "tool conversation fails", f"{type(exc).__name__}: {exc}")]
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, history, full, autojunk=False).get_opcodes():
        if op != "equal":
            stored, rendered = chat.tokenizer.decode(history[i1:i2]), chat.tokenizer.decode(full[j1:j2])
            findings.append(_classify(stored, rendered, "tool", system_once=False))
    return findings
