"""Tool-call formats of chat-template families: which one a template uses and how a sampled turn's calls are parsed.

A model writes a tool call in the format its chat template teaches it. The format is chosen from the template
text (:func:`detect_tool_format`), never from the model name:

========================  =======================================================================  =============
format                    what the model samples (after the generation prompt)                     families
========================  =======================================================================  =============
``hermes``                ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several    Hermes, Qwen2.5,
                          per turn, then the end token                                             Qwen3, SmolLM3
``llama3_json``           ``{"name": ..., "parameters": {...}}`` as the whole message, optionally  Llama-3.1/3.2
                          after ``<|python_tag|>``; ended by ``<|eom_id|>`` or ``<|eot_id|>``
``mistral``               ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "9 chars"}]</s>``  Mistral
``harmony``               ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>``   gpt-oss
                          ``{...}<|call|>`` or ``to=functions.NAME<|channel|>commentary json``
                          ``<|message|>{...}<|call|>`` (one call per turn)
========================  =======================================================================  =============

Parsing reads the sampled ids decoded *with* special tokens (``Action.text`` is decoded without them, which
strips ``[TOOL_CALLS]``, ``<|channel|>``, ``<|call|>``), and only turns that ended on an end token: a call cut by
the token budget is not executed. A call that cannot be parsed is a :class:`~hf_rollouts.types.ToolCall` with
``error`` set (answered to the model as a tool error, counted), never an exception.

transformers 5.x has a declarative parser (``tokenizer.parse_response`` driven by ``tokenizer.response_template``),
but ships templates for it only inside its serve CLI (Qwen2/Qwen3 Hermes) and none for Llama-3.1, Mistral or
gpt-oss, and one malformed call fails the whole turn there. So the four formats above have a small parser each
here; a tokenizer whose template is none of them but that ships its own ``response_template`` is parsed with
``tokenizer.parse_response`` (format ``response_template``; a parse failure is one malformed call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..types import ToolCall

ParseFn = Callable[[str, str | None], tuple[str, list[ToolCall]]]
"""``(turn text without its end token, the end token) -> (content outside the calls, calls)``."""


class ToolTemplateError(ValueError):
    """The chat template cannot carry tool turns (the message names the family and the reason)."""


def template_family(chat_template: str) -> str:
    """A readable family name for a chat template, from its markers (for messages only)."""
    for marker, name in _FAMILY_MARKERS:
        if marker in chat_template:
            return name
    return "unknown family"


_FAMILY_MARKERS = (
    ("<|channel|>", "gpt-oss (harmony)"),
    ("<|start_header_id|>", "Llama-3"),
    ("[TOOL_CALLS]", "Mistral"),
    ("<<SYS>>", "Llama-2"),
    ("<start_of_turn>", "Gemma"),
    ("<｜Assistant｜>", "DeepSeek-R1"),
    ("<|assistant|>", "Phi-3"),
    ("/no_think", "SmolLM3"),
    ("<think>", "Qwen3"),
    ("<tool_call>", "Hermes / Qwen2.5"),
    ("<|im_start|>", "ChatML"),
    ("[INST]", "Llama-2 / Mistral"),
)


def _loads(body: str) -> tuple[Any, str | None]:
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON ({exc.msg} at position {exc.pos})"


def _call_from(obj: Any, raw: str, *, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall:
    """A call from a decoded ``{"name": ..., "arguments": {...}}`` object (arguments may be a JSON string)."""
    if not isinstance(obj, dict):
        return ToolCall("", None, raw=raw, error=f"expected a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", None, raw=raw, error='the call has no "name" string')
    key = next((k for k in args_keys if k in obj), None)
    args = {} if key is None else obj[key]
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args, problem = _loads(args)
        if problem:
            return ToolCall(name, None, raw=raw, error=f"arguments: {problem}")
    if not isinstance(args, dict):
        return ToolCall(name, None, raw=raw, error=f"arguments must be a JSON object, got {type(args).__name__}")
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else ""
    return ToolCall(name, args, id=call_id, raw=raw)


def _json_call(body: str, raw: str) -> ToolCall:
    obj, problem = _loads(body.strip())
    return ToolCall("", None, raw=raw, error=problem) if problem else _call_from(obj, raw)


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)


def parse_hermes(text: str, end: str | None) -> tuple[str, list[ToolCall]]:
    calls = []
    for m in _HERMES.finditer(text):
        if not m.group(2):
            calls.append(ToolCall("", None, raw=m.group(0), error="<tool_call> is not closed by </tool_call>"))
        else:
            calls.append(_json_call(m.group(1), m.group(0)))
    first = _HERMES.search(text)
    return (text[: first.start()] if first else text).strip(), calls


_LLAMA_CALL = re.compile(r'\A\s*(<\|python_tag\|>)?\s*(\{\s*"name"\s*:.*)\Z', re.S)


def parse_llama3_json(text: str, end: str | None) -> tuple[str, list[ToolCall]]:
    """One JSON call per message (the template raises on more): the whole message, optionally after
    ``<|python_tag|>``. Text after ``<|python_tag|>`` that is not a JSON call is a malformed call."""
    m = _LLAMA_CALL.match(text)
    if m:
        return "", [_json_call(m.group(2), text.strip())]
    if "<|python_tag|>" in text:
        before, _, body = text.partition("<|python_tag|>")
        error = 'expected one JSON call {"name": ..., "parameters": {...}} after <|python_tag|>'
        return before.strip(), [ToolCall("", None, raw="<|python_tag|>" + body, error=error)]
    return text.strip(), []


def parse_mistral(text: str, end: str | None) -> tuple[str, list[ToolCall]]:
    if "[TOOL_CALLS]" not in text:
        return text.strip(), []
    before, _, body = text.partition("[TOOL_CALLS]")
    raw = "[TOOL_CALLS]" + body
    obj, problem = _loads(body.strip())
    if problem:
        return before.strip(), [ToolCall("", None, raw=raw, error=problem)]
    items = obj if isinstance(obj, list) else [obj]
    return before.strip(), [_call_from(item, json.dumps(item)) for item in items] or [
        ToolCall("", None, raw=raw, error="[TOOL_CALLS] holds an empty list")
    ]


_HARMONY_HEADER = re.compile(
    r"(?:to=functions\.(?P<pre>[^\s<]+)\s*)?<\|channel\|>\s*(?P<channel>\w+)"
    r"(?:\s+to=functions\.(?P<post>[^\s<]+))?\s*(?:<\|constrain\|>)?\s*(?P<ctype>\w+)?\s*<\|message\|>",
    re.S,
)


def parse_harmony(text: str, end: str | None) -> tuple[str, list[ToolCall]]:
    """The turn's last message is a call when it is addressed ``to=functions.NAME`` (in the header before
    ``<|channel|>`` or after the channel name) and the turn ended on ``<|call|>``. The analysis message before it,
    if any, is the content."""
    messages = text.split("<|start|>assistant")
    last = messages[-1]
    head = _HARMONY_HEADER.search(last)
    if end != "<|call|>" or head is None or not (head.group("pre") or head.group("post")):
        return "", []
    name = head.group("pre") or head.group("post")
    body = last[head.end() :]
    analysis = re.search(r"<\|channel\|>\s*analysis\s*<\|message\|>(.*?)(?:<\|end\|>|\Z)", text, re.S)
    content = analysis.group(1).strip() if analysis and analysis.start() < len(text) - len(last) else ""
    obj, problem = _loads(body.strip())
    raw = last.strip()
    if problem:
        return content, [ToolCall(name, None, raw=raw, error=problem)]
    if not isinstance(obj, dict):
        return content, [
            ToolCall(name, None, raw=raw, error=f"arguments must be a JSON object, got {type(obj).__name__}")
        ]
    return content, [ToolCall(name, obj, raw=raw)]


@dataclass(frozen=True)
class ToolFormat:
    """How one family writes tool calls and wants tool results.

    Attributes:
        name: ``hermes``, ``llama3_json``, ``mistral``, ``harmony`` or ``response_template``.
        parse: the turn's text (decoded with special tokens, without its end token) → content and calls.
        call_end_tokens: tokens that end a tool-call turn besides the template's own end token (Llama
            ``<|eom_id|>``, gpt-oss ``<|call|>``); the tool-result delta is cut after one of them.
        json_results: tool results go to the template ``json.dumps``-ed (Mistral renders content raw inside JSON).
        call_id_length: call ids must have this many characters (Mistral: 9); generated when the model gave none.
        calls_per_message: the template renders at most this many calls per assistant message (Llama, gpt-oss: 1).
        rewrites: how the family's templates re-render a sampled call turn in history (the stored ids keep what
            was sampled); named by :func:`~hf_rollouts.chat.check_chat_template`.
    """

    name: str
    parse: ParseFn
    call_end_tokens: tuple[str, ...] = ()
    json_results: bool = False
    call_id_length: int | None = None
    calls_per_message: int | None = None
    rewrites: tuple[tuple[str, str], ...] = ()

    def result_content(self, text: str) -> str:
        """What goes into a ``tool`` message's ``content`` for a result ``text``."""
        return json.dumps(text) if self.json_results else text

    def call_id(self, given: str, turn: int, index: int) -> str:
        """The id of call ``index`` of agent turn ``turn``: the model's own when it fits, else a generated one
        (deterministic, so episodes replay identically)."""
        if self.call_id_length is None:
            return given or f"call_{turn}_{index}"
        if len(given) == self.call_id_length and given.isalnum():
            return given
        return f"t{turn:04d}c{index:03d}"[: self.call_id_length].rjust(self.call_id_length, "0")


HERMES = ToolFormat("hermes", parse_hermes)
LLAMA3_JSON = ToolFormat(
    "llama3_json",
    parse_llama3_json,
    ("<|eom_id|>", "<|eot_id|>"),
    calls_per_message=1,
    rewrites=(("tool-call end token rewritten in history", "<|eom_id|> → <|eot_id|>, <|python_tag|> dropped"),),
)
MISTRAL = ToolFormat("mistral", parse_mistral, json_results=True, call_id_length=9)
HARMONY = ToolFormat(
    "harmony",
    parse_harmony,
    ("<|call|>",),
    calls_per_message=1,
    rewrites=(
        (
            "tool-call header rewritten in history",
            "<|channel|>commentary to=functions.NAME <|constrain|>json → to=functions.NAME<|channel|>commentary json",
        ),
    ),
)
TOOL_FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, HARMONY)}


def response_template_format(tokenizer: Any) -> ToolFormat:
    """A format that parses with the tokenizer's own ``response_template`` (``tokenizer.parse_response``)."""

    def parse(text: str, end: str | None) -> tuple[str, list[ToolCall]]:
        try:
            message = tokenizer.parse_response(text, prefix="")
        except Exception as exc:  # the declarative parser fails the whole turn on one bad call
            return "", [ToolCall("", None, raw=text, error=f"{type(exc).__name__}: {exc}")]
        calls = []
        for item in message.get("tool_calls") or []:
            fn = item.get("function", item) if isinstance(item, dict) else item
            calls.append(_call_from(fn, json.dumps(item, default=str)))
        content = message.get("content")
        return (content if isinstance(content, str) else ""), calls

    return ToolFormat("response_template", parse)


def detect_tool_format(chat_template: str, tokenizer: Any = None) -> ToolFormat | None:
    """The tool-call format ``chat_template`` teaches, or ``None`` when it shows none.

    Harmony (``to=functions.`` and ``<|channel|>``), Mistral (``[TOOL_CALLS]``), Llama-3 JSON
    (``<|start_header_id|>`` with ``tool_calls``), Hermes (``<tool_call>``); otherwise the tokenizer's own
    ``response_template`` when it ships one.
    """
    if "<|channel|>" in chat_template and "functions." in chat_template:
        return HARMONY
    if "[TOOL_CALLS]" in chat_template:
        return MISTRAL
    if "<|start_header_id|>" in chat_template and "tool_calls" in chat_template:
        return LLAMA3_JSON
    if "<tool_call>" in chat_template:
        return HERMES
    if tokenizer is not None and getattr(tokenizer, "response_template", None) is not None:
        return response_template_format(tokenizer)
    return None


__all__ = [
    "HARMONY",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "TOOL_FORMATS",
    "ToolFormat",
    "ToolTemplateError",
    "detect_tool_format",
    "template_family",
]
