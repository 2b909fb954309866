"""The Chat Completions wire format: a request read and checked (:class:`ChatRequest`), the answer written
(:func:`completion_body`, :func:`stream_chunks`), and errors in OpenAI's JSON shape (:class:`APIError`).

What a request may ask and what the endpoint does with it (the reference page lists the same):

* ``model``: must be the name the run serves (else 404 ``model_not_found``); ``messages``: a non-empty list of
  ``system`` / ``developer`` / ``user`` / ``assistant`` / ``tool`` messages whose ``content`` is a string, a list
  of ``text`` parts (joined) or null (an assistant message with ``tool_calls``); images and audio are refused (400).
* ``tools`` (``type: function``): rendered by the model's chat template; ``tool_choice``: ``auto``, ``none``,
  ``required`` or a named function are accepted and **recorded, not enforced** (the agent samples freely; with
  ``none`` no call is parsed from the answer).
* ``n``: 1 only (400 otherwise). ``max_tokens`` / ``max_completion_tokens``: honoured, the answer is cut after that
  many sampled ids (the run's own ``max_new_tokens`` is the ceiling); ``stop`` (a string or up to 4): honoured, the
  answer ends with the sampled token that completes the first stop string (the text stops before it, as OpenAI's).
* ``stream`` with ``stream_options.include_usage``: server-sent events, ``data: [DONE]`` last.
* sampling fields (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``frequency_penalty``,
  ``presence_penalty``, ``repetition_penalty``, ``logit_bias``): the run's sampling settings govern. They are
  recorded with the call (``sampling_fields="record"``, the default) or refused with a 400 naming the field
  (``"refuse"``). ``logprobs``/``top_logprobs``, ``response_format`` and other fields are recorded and not honoured.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
)
"""Request fields the run's sampling settings govern (recorded, or refused with ``sampling_fields="refuse"``)."""
KNOWN_FIELDS = frozenset(
    "model messages tools tool_choice n max_tokens max_completion_tokens stop stream stream_options "
    "parallel_tool_calls user metadata store logprobs top_logprobs response_format service_tier "
    "reasoning_effort extra_body".split()
) | frozenset(SAMPLING_FIELDS)


class APIError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 as OpenAI answers a body it cannot parse."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(
            f"We could not parse the JSON body of your request ({exc}). The endpoint expects a JSON payload "
            "(Content-Type: application/json)."
        ) from exc
    if not isinstance(body, dict):
        raise bad(f"The request body must be a JSON object, got {type(body).__name__}.")
    return body


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text", "output_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(
                    f"{where}.content[{i}] is a {kind!r} part; only text parts are served (the run's agent reads "
                    "text).",
                    param=f"{where}.content",
                )
            if not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{i}].text must be a string.", param=f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}.content must be a string, a list of text parts or null.", param=f"{where}.content")


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value  # kept as written: a template renders what it is given
    return value


def read_message(m: Any, i: int) -> dict[str, Any]:
    """Message ``i`` of a request in the form chat templates take (text content, ``developer`` as ``system``, call
    arguments decoded from their JSON text); a 400 naming the message when it cannot be."""
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise bad(f"{where} must be an object with a 'role' among {list(ROLES)}.", param=where)
    role = "system" if m["role"] == "developer" else m["role"]
    out: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise bad(f"{where}.tool_calls must be a list on an assistant message.", param=f"{where}.tool_calls")
        out["tool_calls"] = []
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad(f"{where}.tool_calls[{j}] needs function.name.", param=f"{where}.tool_calls")
            out["tool_calls"].append(
                {"id": c.get("id", ""), "type": "function",
                 "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments", {}))}}
            )  # fmt: skip
    if role == "tool":
        if not isinstance(m.get("tool_call_id", ""), str):
            raise bad(f"{where}.tool_call_id must be a string.", param=f"{where}.tool_call_id")
        out["tool_call_id"] = m.get("tool_call_id", "")
        if m.get("name"):
            out["name"] = m["name"]
        out["content"] = out["content"] or ""
    elif out["content"] is None and role != "assistant":
        raise bad(f"{where}.content is null; only an assistant message may have no content.", param=f"{where}.content")
    if out["content"] is None:
        out["content"] = ""  # templates print a null content as "None"
    return out


def stored_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the ``conversations`` column stores it: call arguments as JSON text, content a string."""
    out = {**message, "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": _json_text(c["function"].get("arguments"))}}
            for c in message["tool_calls"]
        ]
    return out


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad(f"{key} must be an integer >= 1, got {value!r}.", param=key)
    return value


@dataclass
class ChatRequest:
    """One checked ``POST /v1/chat/completions`` body (see the module docstring)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    asked: dict[str, Any] = field(default_factory=dict)
    """Fields the request set that are recorded, not honoured (sampling fields, ``tool_choice``, unknown ones)."""

    @classmethod
    def parse(cls, body: dict[str, Any], model: str, sampling_fields: str = "record") -> ChatRequest:
        """Check ``body`` against the served ``model``; :class:`APIError` (400 or 404) names what is wrong."""
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise bad("you must provide a model parameter.", param="model")
        if name != model:
            raise APIError(
                404, f"The model `{name}` does not exist or you do not have access to it. This endpoint serves "
                f"`{model}`.", code="model_not_found", param="model",
            )  # fmt: skip
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("messages must be a non-empty list.", param="messages")
        messages = [read_message(m, i) for i, m in enumerate(raw)]
        tools = body.get("tools")
        if tools is not None and (
            not isinstance(tools, list)
            or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
        ):
            raise bad("tools must be a list of {'type': 'function', 'function': {...}} objects.", param="tools")
        n = body.get("n")
        if n not in (None, 1):
            raise bad(f"n={n!r} is not served: this endpoint samples one choice per request (n=1).", param="n")
        max_tokens = _int(body, "max_completion_tokens") or _int(body, "max_tokens")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else (stop or [])
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise bad("stop must be a string or a list of up to 4 non-empty strings.", param="stop")
        stream = body.get("stream") or False
        if not isinstance(stream, bool):
            raise bad("stream must be a boolean.", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise bad("stream_options must be an object.", param="stream_options")
        asked = {k: v for k, v in body.items() if v is not None and k in SAMPLING_FIELDS}
        if asked and sampling_fields == "refuse":
            key = next(iter(asked))
            raise bad(
                f"{key}={asked[key]!r}: this endpoint samples with the run's sampling settings and refuses "
                "sampling fields (env_config sampling_fields='refuse'); leave the field out.",
                param=key,
            )
        for key in ("tool_choice", "logprobs", "top_logprobs", "response_format", "parallel_tool_calls"):
            if body.get(key) is not None:
                asked[key] = body[key]
        asked.update({k: v for k, v in body.items() if k not in KNOWN_FIELDS})
        return cls(
            messages, tools, body.get("tool_choice"), max_tokens, list(stop), stream,
            bool(options.get("include_usage")), asked,
        )  # fmt: skip


@dataclass(frozen=True)
class Reply:
    """What one call answered: the text, the tool calls (OpenAI form), why it ended, the token counts."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def completion_body(reply: Reply, call_id: str, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object of a non-streamed answer."""
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason, "logprobs": None}],
        "usage": reply.usage(),
    }


def stream_chunks(reply: Reply, call_id: str, model: str, include_usage: bool) -> list[bytes]:
    """The server-sent events of a streamed answer: the role, the content, each tool call, the finish reason, the
    usage (with ``include_usage``: a last chunk with empty ``choices``), then ``data: [DONE]``."""
    created = int(time.time())

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: dict | None = None) -> bytes:
        body: dict[str, Any] = {"id": call_id, "object": "chat.completion.chunk", "created": created, "model": model}
        body["choices"] = (
            [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        )
        if include_usage:
            body["usage"] = usage
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    if reply.content:
        events.append(chunk({"content": reply.content}))
    for i, call in enumerate(reply.tool_calls):
        events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    events.append(chunk({}, reply.finish_reason))
    if include_usage:
        events.append(chunk(None, usage=reply.usage()))
    return [*events, b"data: [DONE]\n\n"]


def model_list(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(model)]}


def model_card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "hf-rollouts"}
