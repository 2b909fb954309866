"""A request's messages to prompt ids, and a sampled answer to OpenAI's message, token-exact.

**The prompt of a call** is what the model conditions on, in one of two ways:

* **extension** (token in, token out): when the request's messages are the previous call's messages, then the
  assistant message this endpoint answered (as it was answered: same content, same tool calls), then either one new
  ``user`` message or the ``tool`` results of exactly that answer's calls, in order (and the same ``tools``), the
  prompt is the previous call's stored ids + the ids it sampled + the new messages rendered as a delta by the chat
  template (:meth:`~hf_rollouts.chat.ChatDelta.user_delta_ids`, :meth:`~hf_rollouts.chat.tool_turns.ToolTurns.
  result_ids`), exactly as an env's episode grows; nothing sampled is re-tokenized;
* **render**: anything else (the program edited, dropped or summarised its history, changed the tools, sent
  several new messages at once) is rendered whole by the chat template (``apply_chat_template`` of the messages and
  tools, with the generation prompt), special-token strings in non-assistant text spelled out as text.

Either way the recorder decides whether the prompt extends the current sample (``add_call``); a rendered prompt that
does not (a template that re-renders past turns differently, an edited history) starts a new sample.

**The answer**: its text is the sampled ids decoded without special tokens; with ``tools`` in the request, tool calls
are parsed per the template's family (:mod:`hf_rollouts.chat.tool_calls`) from the ids decoded with special tokens,
only when the turn ended on an end token, and returned as OpenAI ``tool_calls`` (arguments as JSON text). A call that
cannot be parsed stays in the content as sampled.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ...chat import ChatDelta
from ...chat.tool_calls import ToolFormat
from ...chat.tool_turns import PROBE_TOOL, ToolTurns
from ...types import ToolCall
from .protocol import ChatRequest, read_message


def _key(message: dict[str, Any]) -> str:
    """A message as compared between calls (content ``None`` = ``""``; call arguments as decoded JSON)."""
    calls = [
        (c.get("id", ""), c["function"]["name"], c["function"].get("arguments"))
        for c in message.get("tool_calls") or []
    ]
    parts = (message["role"], message.get("content") or "", calls, message.get("tool_call_id"))
    return json.dumps(parts, sort_keys=True, default=str)


class Renderer:
    """The chat template of one env, shared by its episodes: a :class:`ChatDelta` per tool set, the tool format."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.tokenizer, self.kwargs = tokenizer, dict(template_kwargs or {})
        self._chats: dict[str, ChatDelta] = {}
        self._lock = threading.Lock()

    def chat(self, tools: list[dict[str, Any]] | None) -> ChatDelta:
        key = json.dumps(tools, sort_keys=True, default=str)
        with self._lock:
            chat = self._chats.get(key)
            if chat is None:
                if len(self._chats) > 64:  # programs that send ever-new tool sets: keep the cache small
                    self._chats.clear()
                chat = self._chats[key] = ChatDelta(self.tokenizer, dict(self.kwargs), tools=tools or None)
            return chat

    @cached_property
    def tool_format(self) -> ToolFormat | None:
        """How the template writes tool calls (``None``: a template without a known format; calls are not parsed)."""
        return ToolTurns(self.chat([PROBE_TOOL])).format

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def parse_calls(self, ids: list[int], ended: bool, turn: int) -> tuple[str, list[ToolCall]] | None:
        """The content and well-formed calls of a sampled turn (see the module docstring); ``None`` when it holds
        none (or one that cannot be parsed: then the whole turn is answered as text)."""
        fmt = self.tool_format
        if fmt is None or not ended or not ids:
            return None
        content, calls = fmt.parse(
            self.tokenizer.decode(ids[:-1], skip_special_tokens=False), self.tokenizer.convert_ids_to_tokens(ids[-1])
        )
        if not calls or any(c.error is not None for c in calls):
            return None
        return content, [ToolCall(c.name, c.arguments, fmt.call_id(c.id, turn, i), c.raw) for i, c in enumerate(calls)]


@dataclass
class Conversation:
    """What one episode's endpoint answered last, so the next call can extend it (see the module docstring)."""

    renderer: Renderer
    keys: list[str] | None = None
    tools_key: str = ""
    ids: list[int] = field(default_factory=list)
    agent_ids: list[int] = field(default_factory=list)
    ended: bool = False
    calls: list[ToolCall] = field(default_factory=list)

    def prompt(self, request: ChatRequest) -> tuple[list[int], str]:
        """The prompt ids of ``request`` and how they were made: ``"extend"`` (a user message), ``"tool_results"``
        (the results of the last answer's calls) or ``"render"``."""
        chat = self.renderer.chat(request.tools)
        delta = self._delta(request, chat)
        if delta is not None:
            return self.ids + delta, "tool_results" if request.messages[-1]["role"] == "tool" else "extend"
        return chat.initial_ids(request.messages), "render"

    def _delta(self, request: ChatRequest, chat: ChatDelta) -> list[int] | None:
        if self.keys is None or json.dumps(request.tools, sort_keys=True, default=str) != self.tools_key:
            return None
        n = len(self.keys)
        if len(request.messages) <= n or [_key(m) for m in request.messages[:n]] != self.keys:
            return None
        new = request.messages[n:]
        if len(new) == 1 and new[0]["role"] == "user":
            return chat.user_delta_ids(new[0]["content"], self.agent_ids, ended=self.ended)
        if (
            self.calls
            and len(new) == len(self.calls)
            and all(m["role"] == "tool" and m.get("tool_call_id") == c.id for m, c in zip(new, self.calls))
        ):
            return ToolTurns(chat).result_ids(self.calls, [m["content"] for m in new])
        return None

    def answered(
        self, request: ChatRequest, message: dict[str, Any], stored: list[int], agent_ids: list[int], ended: bool,
        calls: list[ToolCall],
    ) -> None:  # fmt: skip
        """Remember the call: its messages and the answer ``message``, the sample's ``stored`` ids after it, the
        agent's ids of this turn, whether they ended on an end token, and the parsed calls."""
        self.keys = [_key(m) for m in request.messages] + [_key(read_message(message, 0))]
        self.tools_key = json.dumps(request.tools, sort_keys=True, default=str)
        self.ids, self.agent_ids, self.ended, self.calls = list(stored), list(agent_ids), ended, list(calls)
