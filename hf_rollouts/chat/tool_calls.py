"""Tool-call formats of chat-template families: which one a template uses and how a sampled turn's calls are parsed.

A model writes a tool call in the format its chat template teaches it. The format is chosen from what the template
*renders* for an assistant message holding a known call (:func:`recognise_call`, driven by
:class:`~hf_rollouts.chat.tool_turns.ToolTurns`), never from token names in the template source nor the model name:

========================  =======================================================================  =============
format                    what the model samples (after the generation prompt)                     families
========================  =======================================================================  =============
``hermes``                ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, several    Hermes-2-Pro,
                          per turn, then the end token                                             Hermes-3,
                                                                                                   Qwen2.5, Qwen3,
                                                                                                   SmolLM3
``llama3_json``           ``{"name": ..., "parameters": {...}}`` as the whole message, optionally  Llama-3.1/3.2
                          after ``<|python_tag|>``; ended by ``<|eom_id|>`` or ``<|eot_id|>``
``pythonic``              ``[name(key="value", n=1), other()]`` as the whole message (Python       Llama-3.2/3.3
                          literals as values), optionally inside ``<|python_start|>``/              pythonic,
                          ``<|python_end|>``; several calls per turn                               Llama-4, ToolACE
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
gpt-oss, and one malformed call fails the whole turn there. So the formats above have a small parser each
here (pythonic calls are read with Python's own ``ast``); a tokenizer whose template renders none of them but that
ships its own ``response_template`` is parsed with ``tokenizer.parse_response`` (format ``response_template``; a
parse failure is one malformed call).
"""

from __future__ import annotations

import ast
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
    """A readable family name for a chat template, from its markers (for messages only: the tool-call format is
    read from renders, see :func:`recognise_call`)."""
    for markers, name in _FAMILY_MARKERS:
        if all(m in chat_template for m in markers):
            return name
    return "unknown family"


_FAMILY_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>",), "gpt-oss (harmony)"),
    (("<|header_start|>",), "Llama-4"),
    (("<|start_header_id|>",), "Llama-3"),
    (("<|start_of_role|>",), "Granite"),
    (("[TOOL_CALLS]",), "Mistral"),
    (("<<SYS>>",), "Llama-2"),
    (("<start_of_turn>",), "Gemma"),
    (("<｜Assistant｜>", "</think>"), "DeepSeek-R1"),
    (("<｜Assistant｜>",), "DeepSeek-V3"),
    (("functools",), "Phi-4-mini"),
    (("<|assistant|>",), "Phi-3"),
    (("<|im_sep|>",), "phi-4"),
    (("/no_think",), "SmolLM3"),
    (("<think>",), "Qwen3"),
    (("You are a function calling AI model",), "Hermes"),
    (("<tool_call>",), "Hermes / Qwen2.5"),
    (("<|im_start|>",), "ChatML"),
    (("[INST]",), "Llama-2 / Mistral"),
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


_PYTHONIC_START = re.compile(r"\A\s*(?:<\|python_tag\|>|<\|python_start\|>)?\s*\[\s*[A-Za-z_]\w*\s*\(", re.S)
_PYTHONIC_WRAP = re.compile(r"\A\s*(?:<\|python_tag\|>|<\|python_start\|>)?(.*?)(?:<\|python_end\|>)?\s*\Z", re.S)


def parse_pythonic(text: str, end: str | None) -> tuple[str, list[ToolCall]]:
    """A message that is a Python list of calls, ``[name(key=value, ...), ...]`` (values Python literals), read
    with ``ast``; optionally after ``<|python_tag|>`` or inside ``<|python_start|>``/``<|python_end|>``. A message
    that starts like one (``[identifier(``) but is not a list of keyword-only calls with literal values is one
    malformed call; anything else is plain content."""
    if not _PYTHONIC_START.match(text):
        return text.strip(), []
    raw = text.strip()
    body = _PYTHONIC_WRAP.match(text).group(1).strip()  # type: ignore[union-attr]
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError) as exc:
        why = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        return "", [ToolCall("", None, raw=raw, error=f"not a Python list of calls ({why})")]
    if not isinstance(tree, ast.List) or not tree.elts:
        return "", [ToolCall("", None, raw=raw, error="expected a Python list of calls [name(key=value), ...]")]
    return "", [_pythonic_call(node, raw) for node in tree.elts]


def _pythonic_call(node: ast.expr, raw: str) -> ToolCall:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return ToolCall("", None, raw=raw, error=f"{ast.unparse(node)!r} is not a call name(key=value, ...)")
    name, text = node.func.id, ast.unparse(node)
    if node.args or any(k.arg is None for k in node.keywords):
        return ToolCall(name, None, raw=text, error="arguments must be given by keyword (name(key=value))")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        try:
            args[kw.arg] = ast.literal_eval(kw.value)  # type: ignore[index]
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return ToolCall(
                name, None, raw=text, error=f"argument {kw.arg}={ast.unparse(kw.value)} is not a Python literal"
            )
    return ToolCall(name, args, raw=text)


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
        name: ``hermes``, ``llama3_json``, ``pythonic``, ``mistral``, ``harmony`` or ``response_template``.
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
PYTHONIC = ToolFormat(
    "pythonic",
    parse_pythonic,
    ("<|eom_id|>", "<|eot_id|>", "<|eom|>", "<|eot|>"),
    rewrites=(
        (
            "tool-call arguments rewritten in history",
            "each value re-rendered with the template's '%s'|format (Llama-3.2 drops string quotes, Llama-4 quotes "
            "every value, ToolACE appends 'r')",
        ),
    ),
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
TOOL_FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, PYTHONIC, MISTRAL, HARMONY)}


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


def _is_probe(obj: Any, name: str, args: dict[str, Any]) -> bool:
    """``obj`` is the JSON call ``{"name": name, "arguments"|"parameters": args}`` (either key order)."""
    return isinstance(obj, dict) and obj.get("name") == name and obj.get("arguments", obj.get("parameters")) == args


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _is_hermes_probe(body: str, name: str, args: dict[str, Any]) -> bool:
    """A ``<tool_call>`` body is the call: its JSON, or, where the template's own history JSON is broken (vLLM's
    Hermes template writes ``{"name": "lookup"}, "arguments": {...}``), the ``"name"`` key naming the call. Only
    what the model samples is parsed (never the template's history render), and the result delta does not depend
    on how a past call is rendered, so the tags and the name are all the recognition needs."""
    if _is_probe(_json_or_none(body.strip()), name, args):
        return True
    return re.search(rf'"name"\s*:\s*{re.escape(json.dumps(name))}', body) is not None


def recognise_call(text: str, name: str, args: dict[str, Any]) -> ToolFormat | None:
    """The format of ``text``: what a template rendered for an assistant message whose only tool call is
    ``name(**args)`` (between the generation prompt and the turn's end token), or ``None`` when it is none of them.

    The shapes: gpt-oss ``to=functions.NAME``; ``[TOOL_CALLS]`` then JSON naming the call; ``<tool_call>`` around
    the JSON call (or around a ``"name"`` key naming it: some templates' history JSON is malformed); the JSON call as
    the whole message (optionally after ``<|python_tag|>``); ``[NAME(key=...)]`` as the whole message.
    Values inside pythonic calls are not compared: templates re-render them with ``%s``.
    """
    body = text.strip()
    if f"to=functions.{name}" in body and "<|channel|>" in body:
        return HARMONY
    if "[TOOL_CALLS]" in body:
        obj = _json_or_none(body.partition("[TOOL_CALLS]")[2].strip())
        if any(_is_probe(o, name, args) for o in (obj if isinstance(obj, list) else [obj])):
            return MISTRAL
    if any(_is_hermes_probe(m.group(1), name, args) for m in _HERMES.finditer(body)):
        return HERMES
    if _is_probe(_json_or_none(body.removeprefix("<|python_tag|>").strip()), name, args):
        return LLAMA3_JSON
    keys = "|".join(re.escape(k) for k in args)
    if re.fullmatch(rf"(?:<\|python_start\|>)?\[{re.escape(name)}\((?:{keys})=.*\)\](?:<\|python_end\|>)?", body, re.S):
        return PYTHONIC
    return None


__all__ = [
    "HARMONY",
    "HERMES",
    "LLAMA3_JSON",
    "MISTRAL",
    "PYTHONIC",
    "TOOL_FORMATS",
    "ToolFormat",
    "ToolTemplateError",
    "recognise_call",
    "template_family",
]
