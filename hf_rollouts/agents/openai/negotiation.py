"""Capability negotiation: one small probe decides how an agent talks to its server.

:func:`negotiate` runs once per agent (one base URL and model; pickled copies keep the result):

1. unless settings say otherwise, a 1-token ``/v1/completions`` request with a token-id prompt,
   ``return_token_ids`` and ``logprobs: 0``. Ids in the answer (``choices[0].token_ids``) →
   **token mode**. A 200 without ids (the field was silently ignored, as older vLLM and
   SGLang without it do), an HTTP 400/422 about the prompt or about ``return_token_ids``
   (``transformers serve``: "prompt must be a string"), or a 404 → no token mode;
2. otherwise a 1-token ``/v1/chat/completions`` request → **chat mode**, recording whether the
   answer carries ids, log-probs and prompt ids.

An HTTP 400/422 whose message names optional fields the probe sent (``"Unexpected fields in
the request: {'stop_token_ids'}"``) drops those fields and retries; that is negotiation, not a
failure. Connection errors and 5xx are retried by the client and, if they persist, raise.
The neutral sampling fields (``top_k: -1``, ``min_p: 0``, ...; :mod:`.sampling_params`) are
optional too, and are also dropped when a later request, sent without a probe, is rejected for
naming them (:func:`post_dropping`).

Explicit settings win: ``mode="tokens"`` or ``mode="chat"`` with ``request_token_ids`` and
``request_logprobs`` both set skip the probe (``source="settings"``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .parsing import int_list
from .sampling_params import NEUTRAL_FIELDS, STOP_TEXT_FIELD
from .settings import OpenAIHTTPError, OpenAIRequestError, OpenAISettings

OPTIONAL_FIELDS = (
    "return_token_ids",
    "logprobs",
    "stop_token_ids",
    "seed",
    "top_p",
    STOP_TEXT_FIELD,
    *NEUTRAL_FIELDS,
)
"""Request fields a server may lack; the probe drops each one the server names in a 400/422."""

Post = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Capabilities:
    """The outcome of negotiation.

    Attributes:
        mode: ``"tokens"`` (``/v1/completions`` with prompt ids) or ``"chat"``.
        dropped: optional fields the server rejected; never sent again.
        returns_ids / returns_logprobs / returns_prompt_ids: what the probe's answer carried.
        source: ``"probe"`` or ``"settings"`` (explicit settings, no probe).
        notes: why token mode was not chosen, when it was not.
    """

    mode: str
    dropped: tuple[str, ...] = ()
    returns_ids: bool = False
    returns_logprobs: bool = False
    returns_prompt_ids: bool = False
    source: str = "probe"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def sends(self, name: str) -> bool:
        return name not in self.dropped

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["dropped"], d["notes"] = list(self.dropped), list(self.notes)
        return d


def _named_fields(detail: str, sent: dict[str, Any], droppable: tuple[str, ...]) -> list[str]:
    return [f for f in droppable if f in sent and re.search(rf"(?<![\w]){re.escape(f)}(?![\w])", detail)]


async def post_dropping(
    post: Post,
    url: str,
    body: dict[str, Any],
    droppable: tuple[str, ...],
    *,
    fatal: tuple[str, ...] = (),
    before: Callable[[], None] = lambda: None,
) -> tuple[dict[str, Any], list[str]]:
    """POST ``body``; while the server answers 400/422 naming fields of ``droppable`` that the body
    sends, drop them and POST again. ``(answer, dropped)``.

    Any other error raises, as does a 400/422 that names none of them or names one of ``fatal``.
    ``before`` is called before each POST.
    """
    body, dropped = dict(body), []
    while True:
        before()
        try:
            return await post(url, body), dropped
        except OpenAIHTTPError as exc:
            named = _named_fields(exc.detail, body, droppable) if exc.status in (400, 422) else []
            if not named or _named_fields(exc.detail, dict.fromkeys(fatal, 1), fatal):
                raise
            for f in named:
                body.pop(f)
                dropped.append(f)


async def _probe(
    post: Post,
    url: str,
    body: dict[str, Any],
    droppable: tuple[str, ...],
    count: Callable[[str], None],
    fatal: tuple[str, ...] = (),
) -> tuple[dict[str, Any] | None, list[str], str]:
    """:func:`post_dropping` for a probe: ``(answer or None, dropped, why not)``; an HTTP error gives ``None``."""
    try:
        data, dropped = await post_dropping(
            post, url, body, droppable, fatal=fatal, before=lambda: count("probe_requests")
        )
    except OpenAIHTTPError as exc:
        return None, [], f"HTTP {exc.status} from {url}: {exc.detail[:200]}"
    return data, dropped, ""


async def negotiate(
    post: Post,
    settings: OpenAISettings,
    *,
    completions_url: str,
    chat_url: str,
    token_probe: dict[str, Any] | None,
    chat_probe: dict[str, Any],
    count: Callable[[str], None],
) -> Capabilities:
    """Decide the mode and the fields to send (see the module docstring).

    ``token_probe``/``chat_probe`` are complete 1-token request bodies; ``token_probe`` is
    ``None`` when token mode is impossible (no env tokenizer to build prompts and stops).
    """
    s = settings
    explicit_off = tuple(
        f for f, flag in (("return_token_ids", s.request_token_ids), ("logprobs", s.request_logprobs)) if flag is False
    )
    if s.mode == "tokens":
        return Capabilities(
            "tokens", explicit_off, True, s.request_logprobs is not False, True, "settings", ("mode='tokens' set",)
        )
    if s.mode == "chat" and s.request_token_ids is not None and s.request_logprobs is not None:
        return Capabilities("chat", explicit_off, source="settings", notes=("mode='chat' set",))
    locked = tuple(
        f for f, flag in (("return_token_ids", s.request_token_ids), ("logprobs", s.request_logprobs)) if flag
    )
    droppable = tuple(f for f in OPTIONAL_FIELDS if f not in locked)
    notes: list[str] = []
    if s.mode == "chat":
        notes.append("mode='chat' set")
    elif token_probe is None:
        notes.append("token mode needs the env tokenizer (pass tokenizer=)")
    else:
        body = {k: v for k, v in token_probe.items() if k not in explicit_off}
        data, dropped, why = await _probe(
            post, completions_url, body, droppable, count, fatal=("return_token_ids", "prompt")
        )
        choice = (data.get("choices") or [None])[0] if isinstance(data, dict) else None
        ids = int_list(choice.get("token_ids")) if isinstance(choice, dict) else None
        if ids:
            lp = choice.get("logprobs")
            return Capabilities(
                "tokens",
                tuple(explicit_off) + tuple(dropped),
                returns_ids=True,
                returns_logprobs="logprobs" not in dropped
                and "logprobs" not in explicit_off
                and isinstance(lp, dict)
                and isinstance(lp.get("token_logprobs"), list),
                returns_prompt_ids=int_list(choice.get("prompt_token_ids")) is not None,
            )
        notes.append(why or "the /v1/completions probe answered 200 without choices[0].token_ids")
    body = {k: v for k, v in chat_probe.items() if k not in explicit_off}
    data, dropped, why = await _probe(post, chat_url, body, droppable, count)
    if data is None:
        raise OpenAIRequestError(f"the server rejected the chat probe ({why}); check base_url, model and extra_body.")
    choice = (data.get("choices") or [None])[0]
    if not isinstance(choice, dict):
        raise OpenAIRequestError(f"the chat probe's answer has no choices[0]: {str(data)[:300]}")
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    block = choice.get("logprobs")
    return Capabilities(
        "chat",
        tuple(explicit_off) + tuple(dropped),
        returns_ids=int_list(choice.get("token_ids")) is not None or int_list(message.get("token_ids")) is not None,
        returns_logprobs=isinstance(block, dict) and isinstance(block.get("content"), list),
        returns_prompt_ids=int_list(data.get("prompt_token_ids")) is not None,
        notes=tuple(notes),
    )
