""":class:`ToolTurns`: tool results appended as ``tool`` messages, token-exact, after a sampled tool-call turn.

The rules of :mod:`hf_rollouts.chat` hold for tool turns too:

* the agent's tool-call turn is stored as sampled (rule 1), whatever the template would re-render
  (gpt-oss ``<|channel|>commentary to=functions.f <|constrain|>json`` becomes ``to=functions.f<|channel|>
  commentary json`` in history; Llama-3.1 ``<|eom_id|>`` becomes ``<|eot_id|>``);
* after its end token only what the template writes *after* that turn's end marker is appended (rule 2): the
  ``tool`` messages, rendered by the model's own template, and the generation prompt, as one delta. Parallel
  calls give several ``tool`` messages in that one delta. Tool output is environment text (rule 5): special-token
  strings in it are spelled out, and its tokens are environment tokens (agent mask 0, tool mask 1).

The format is read from a render too: an assistant message holding one known call (``lookup(key="rope")``) is
rendered, and the text between the generation prompt and the turn's end token is recognised
(:func:`~.tool_calls.recognise_call`). A template that renders no call at all in history (SmolLM3) is read by the
format its rendered tool instructions teach (``<tool_call>``). Every tool render passes ``tools`` (the env's schemas,
or the probe tool): the first prompt has them, and some templates loop over them unguarded (Hermes-2-Pro raises
``TypeError: 'NoneType' object is not iterable`` without them).

The delta is read from two renders of ``[dummy user, assistant with the REAL calls] + X``: once with X = the
``tool`` messages, once with X = a dummy user message. Both render the assistant turn as a past turn, so they agree
up to where the tool messages begin; the delta is what the first render writes after the last end token (the
template's end token, an eos, or the format's call end: Llama ``<|eom_id|>``/``<|eot_id|>``, gpt-oss ``<|call|>``)
inside that common part. The real call names and ids are needed: gpt-oss writes the result header
``<|start|>functions.NAME to=assistant`` from the call's name, Mistral writes the call id into ``[TOOL_RESULTS]``.
Per family: Llama-3.1 renders results as role ``ipython`` with JSON-encoded content, one call per message;
Mistral needs 9-character call ids and ``json.dumps``-ed content (:class:`~.tool_calls.ToolFormat`).

Templates that cannot carry tool turns are refused by :meth:`ToolTurns.check`, naming the family and the reason:
Phi-3.5 and phi-4 drop ``tool`` messages, Gemma-2 and Llama-2 raise "roles must alternate", DeepSeek-R1-Distill
writes no generation prompt after tool results, and a template whose rendered call is none of the known formats
(Granite ``<|tool_call|>``, Phi-4-mini, DeepSeek-V3 ``<｜tool▁calls▁begin｜>``) is refused with an excerpt of it.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

from ..types import Message, ToolCall
from . import guard
from .delta import PROBE_USER, PROBE_USER2, ChatDelta
from .tool_calls import (
    HERMES,
    TOOL_FORMATS,
    ToolFormat,
    ToolTemplateError,
    recognise_call,
    response_template_format,
    template_family,
)

_PROBE_RESULT = "\u2063t"
_UNNAMED = "invalid_call"  # the name a malformed call without one is rendered with
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string", "description": "The key."}},
            "required": ["key"],
        },
    },
}
"""The tool schema renders get when the chat has none of its own (a template check without an env)."""
_PROBE_CALL = ToolCall("lookup", {"key": "rope"}, id="call00001")  # 9 alphanumerics: Mistral's ids
_SUPPORTED = (
    "Hermes-2-Pro/Hermes-3, Qwen2.5, Qwen3, SmolLM3, Llama-3.1/3.2 JSON, Llama-3.2/3.3 and Llama-4 pythonic, "
    "ToolACE, Mistral, gpt-oss"
)


class ToolTurns:
    """The tool side of one :class:`~hf_rollouts.chat.ChatDelta`: its format, the refusal check, result deltas."""

    def __init__(self, chat: ChatDelta) -> None:
        self.chat = chat

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The schemas every tool render gets: the chat's own, else :data:`PROBE_TOOL` (see the module docstring)."""
        return self.chat.tools or [PROBE_TOOL]

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.chat.render(messages, add_generation_prompt, tools=self.tools)

    @cached_property
    def _probe(self) -> tuple[ToolFormat | None, str]:
        """(the format the template renders a known call in or ``None``, the rendered call turn it was read from)."""
        chat = self.chat
        user = {"role": "user", "content": PROBE_USER}
        try:
            opened = self._render([user], True)
            full = self._render([user, self.assistant_message("", [_PROBE_CALL])], False)
        except Exception as exc:  # the refusal then comes from the delta probe of check(), with the reason
            return None, f"(the render raises {type(exc).__name__}: {exc})"
        start = len(opened) if full.startswith(opened) else full.find(PROBE_USER) + len(PROBE_USER)
        turn = full[start:]
        specials = guard.special_tokens(chat.tokenizer)
        ends = [*chat.tokenizer.convert_ids_to_tokens(list(chat.end_token_ids))]
        ends += [t for f in TOOL_FORMATS.values() for t in f.call_end_tokens if t in specials]
        cuts = [turn.find(t) for t in ends if t and t in turn]
        turn = turn[: min(cuts)] if cuts else turn
        fmt = recognise_call(turn, _PROBE_CALL.name, _PROBE_CALL.arguments or {})
        if fmt is None and _PROBE_CALL.name not in turn and "<tool_call>" in opened:
            fmt = HERMES  # calls are not rendered in history (SmolLM3): the format its tool instructions teach
        if fmt is None and getattr(chat.tokenizer, "response_template", None) is not None:
            fmt = response_template_format(chat.tokenizer)
        return fmt, turn

    @property
    def format(self) -> ToolFormat | None:
        """The format the template renders tool calls in (see the module docstring), ``None`` if none is known."""
        return self._probe[0]

    @cached_property
    def family(self) -> str:
        return template_family(self.chat.tokenizer.chat_template)

    @cached_property
    def _end_tokens(self) -> tuple[str, ...]:
        """Tokens that can end a tool-call turn: stops, the history end token, the format's call ends."""
        chat = self.chat
        ids = [*chat.end_token_ids]
        tokens = [t for t in chat.tokenizer.convert_ids_to_tokens(ids) if t]
        tokens += [
            t for t in (self.format.call_end_tokens if self.format else ()) if t in guard.special_tokens(chat.tokenizer)
        ]
        return tuple(dict.fromkeys(tokens))

    def check(self) -> ToolFormat:
        """The format, after a probe render that shows the template carries tool turns.

        Raises :class:`~.tool_calls.ToolTemplateError` naming the family and the reason otherwise (for a format
        that is not recognised, an excerpt of the rendered call).
        """
        fmt, rendered = self._probe
        probe = ToolCall("probe", {"x": 1}, id=(fmt or HERMES).call_id("", 0, 0))
        try:
            _, full, _ = self._delta_text([probe], [_PROBE_RESULT], fmt or HERMES)
        except ToolTemplateError as exc:
            reason = str(exc)
        except Exception as exc:  # the template refuses the conversation (e.g. "roles must alternate")
            reason = f"it raises on a tool conversation ({type(exc).__name__}: {exc})"
        else:
            reason = None
            if (fmt or HERMES).result_content(_PROBE_RESULT) not in full:
                reason = "it drops tool messages (a tool result would never reach the model)"
            elif not full.endswith(self._generation_prompt):
                reason = "it writes no generation prompt after tool results"
            elif fmt is None:
                shown = " ".join(rendered.split())
                shown = shown if len(shown) <= 160 else shown[:160] + "..."
                reason = (
                    "its tool-call format is none this library parses (Hermes <tool_call>, Llama-3 JSON, pythonic "
                    "[name(key=value)], Mistral [TOOL_CALLS], gpt-oss to=functions.) and the tokenizer has no "
                    f'response_template: it renders the call lookup(key="rope") as `{shown}`'
                )
        if reason is not None:
            raise ToolTemplateError(
                f"The {self.family} chat template cannot carry tool turns: {reason}. A tool environment needs a "
                f"template whose tool calls this library parses ({_SUPPORTED}) or a tokenizer with a "
                "response_template; use such a model, or give the environment no executable tools."
            )
        return fmt  # type: ignore[return-value]

    @cached_property
    def _generation_prompt(self) -> str:
        u = [{"role": "user", "content": PROBE_USER}]
        with_prompt, bare = self._render(u, True), self._render(u, False)
        return with_prompt[len(bare) :] if with_prompt.startswith(bare) else ""

    def call_message(self, call: ToolCall) -> dict[str, Any]:
        """A call as an assistant message's ``tool_calls`` entry (arguments as a dict, as templates expect)."""
        args = call.arguments if call.arguments is not None else {}
        return {"id": call.id, "type": "function", "function": {"name": call.name or _UNNAMED, "arguments": args}}

    def assistant_message(self, content: str, calls: list[ToolCall]) -> Message:
        return {"role": "assistant", "content": content, "tool_calls": [self.call_message(c) for c in calls]}

    def tool_messages(self, calls: list[ToolCall], results: list[str], fmt: ToolFormat | None = None) -> list[Message]:
        """One ``tool`` message per call, in call order, content as the format wants it."""
        fmt = fmt or self.format or HERMES
        return [
            {"role": "tool", "tool_call_id": c.id, "name": c.name or _UNNAMED, "content": fmt.result_content(r)}
            for c, r in zip(calls, results, strict=True)
        ]

    def _delta_text(self, calls: list[ToolCall], results: list[str], fmt: ToolFormat) -> tuple[str, str, list[str]]:
        """(delta text with guard markers, the full render it was cut from, the guarded literals); see the module
        docstring."""
        chat = self.chat
        literals: list[str] = []
        user = {"role": "user", "content": PROBE_USER}
        assistant = self.assistant_message("", calls)
        tools = guard.protect(self.tool_messages(calls, results, fmt), chat._protected, literals)
        full = self._render([user, assistant, *tools], True)
        other = self._render([user, assistant, *[{**m, "content": PROBE_USER2} for m in tools]], True)
        common = next((i for i, (a, b) in enumerate(zip(full, other)) if a != b), min(len(full), len(other)))
        opened = self._render([user], True)
        start = len(opened) if full.startswith(opened) else full.find(PROBE_USER) + len(PROBE_USER)
        region = full[start:common]
        ends = [region.rfind(t) + len(t) for t in self._end_tokens if t in region]
        if not ends:
            raise ToolTemplateError(
                "it writes no end marker after a tool call, so there is nothing to cut the sampled turn at"
            )
        return full[start + max(ends) :], full, literals

    def result_ids(self, calls: list[ToolCall], results: list[str]) -> list[int]:
        """Ids appended after a tool-call turn that ended on an end token: the ``tool`` messages of ``results``
        (one per call, in order) and the generation prompt."""
        text, _, literals = self._delta_text(calls, results, self.format or HERMES)
        return guard.encode_guarded(self.chat.tokenizer, text, literals)


def detect_tool_format(
    tokenizer: Any, *, tools: list[dict[str, Any]] | None = None, **template_kwargs: Any
) -> ToolFormat | None:
    """The tool-call format ``tokenizer``'s chat template renders (:attr:`ToolTurns.format`), ``None`` if none is
    recognised; :meth:`ToolTurns.check` says why a template is refused."""
    return ToolTurns(ChatDelta(tokenizer, template_kwargs, tools or [PROBE_TOOL])).format


def template_messages(messages: list[Message]) -> list[Message]:
    """A stored conversation in the form chat templates take: call ``arguments`` JSON strings (the OpenAI form the
    ``conversations`` column keeps) decoded to dicts, and keys that are null (Arrow fills every message struct)
    dropped. ``tokenizer.apply_chat_template(template_messages(conv), tools=...)`` re-renders an episode."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        if m.get("tool_calls"):
            m["tool_calls"] = [_decoded_call(c) for c in m["tool_calls"]]
        out.append(m)
    return out


def _decoded_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = dict(call.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            fn["arguments"] = {}
    return {**call, "function": fn}
