"""A JSON-over-HTTP client for inference servers: pooled connections, retries, a total deadline, no redirects.

Built on ``httpx2`` (pydantic's maintained ``httpx`` fork, already installed as a dependency of
``huggingface_hub`` and ``openai``) instead of ``urllib`` because it gives, out of the box:

* **connection pooling** (keep-alive; ``max_connections`` = the agent's concurrency), so a run of
  thousands of requests does not open thousands of TCP connections;
* **redirects off** by default (``follow_redirects=False``): a 3xx is reported, never followed, so
  the ``Authorization`` header can never be sent to another host;
* ``trust_env=False`` for loopback servers, so a ``HTTP(S)_PROXY`` variable cannot divert them.

**Total deadline.** httpx's timeouts bound each socket operation, so a server that trickles one
byte at a time (of its status line, its headers or its body) would never trip them. Each attempt
here has one deadline, ``timeout`` seconds from the moment it is sent (``asyncio.timeout`` around the
whole attempt: connect, send, status line, headers, body), so it ends at its deadline whichever
phase the server stalls in, on whichever connection (proxied or not).

**Where it runs.** The client is async (``httpx2.AsyncClient``) and lives on the engine loop
(:mod:`hf_rollouts.aio`), where the rollout engine awaits each request: no thread per request.

**Retries.** Connection errors, timeouts, a missed deadline, HTTP 429 and 5xx, and a 200 whose
body is not a JSON object are retried ``max_retries`` times with exponential backoff (``backoff *
2**k``, capped at ``max_backoff``; a 429's ``Retry-After`` is honoured up to the cap). A 3xx or
another 4xx raises :class:`~.settings.OpenAIHTTPError` at once, with the server's message
(vLLM's ``error.message``, SGLang's ``message`` or FastAPI's ``detail``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx2

from .settings import OpenAIHTTPError, OpenAIRequestError, OpenAISettings


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def error_message(raw: bytes | str) -> str:
    """The server's error message from an error body (vLLM, SGLang or FastAPI shape), else the raw text."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        for candidate in (
            err.get("message") if isinstance(err, dict) else err,
            data.get("message"),
            data.get("detail"),
        ):
            if candidate:
                return candidate if isinstance(candidate, str) else json.dumps(candidate)
    text = " ".join(text.split())
    return text[:500] + ("..." if len(text) > 500 else "")


class JSONClient:
    """POSTs JSON bodies to one server and returns JSON objects (see the module docstring), on the engine loop.

    ``count(key)`` is called for ``"attempts"`` and ``"retries"``. Its connections belong to the loop it is used on
    (the engine loop, :mod:`hf_rollouts.aio`); not picklable (the agent rebuilds it).
    """

    def __init__(self, settings: OpenAISettings, api_key: str | None, count: Callable[[str], None]) -> None:
        self.settings = settings
        self._count = count
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        n = settings.concurrency
        self._client = httpx2.AsyncClient(
            follow_redirects=False,
            trust_env=not is_loopback(settings.base_url),
            limits=httpx2.Limits(max_connections=n, max_keepalive_connections=n),
            timeout=httpx2.Timeout(settings.timeout),
        )
        self._slots: asyncio.Semaphore | None = None  # ``concurrency`` attempts in flight; the rest wait, uncharged

    async def close(self) -> None:
        await self._client.aclose()

    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``url`` with retries; the decoded JSON object, or :class:`OpenAIRequestError`."""
        s = self.settings
        last_error, retry_after = "", None
        attempts = s.max_retries + 1
        for attempt in range(attempts):
            if attempt:
                delay = min(s.max_backoff, s.backoff * 2 ** (attempt - 1))
                if retry_after is not None:
                    delay = min(s.max_backoff, max(delay, retry_after))
                self._count("retries")
                await asyncio.sleep(delay)
            if self._slots is None:
                self._slots = asyncio.Semaphore(s.concurrency)
            try:
                async with self._slots:
                    self._count("attempts")
                    async with asyncio.timeout(s.timeout):  # the deadline, whatever phase the server stalls in
                        status, headers, raw = await self._attempt(url, body)
            except TimeoutError:
                last_error = (
                    f"timed out: the answer did not complete within the {s.timeout}s deadline "
                    "(a slow or trickling server?)"
                )
                retry_after = None
                continue
            except httpx2.TimeoutException as exc:
                last_error = f"{type(exc).__name__}: timed out after {s.timeout}s"
                retry_after = None
                continue
            except httpx2.TransportError as exc:  # connection refused/reset, a body cut off, ...
                last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                retry_after = None
                continue
            if status == 429 or status >= 500:
                last_error, retry_after = f"HTTP {status}: {error_message(raw)}", _retry_after(headers)
                continue
            if 300 <= status < 400:
                where = headers.get("location", "?")
                raise OpenAIHTTPError(
                    f"POST {url} answered HTTP {status}, a redirect to {where!r}, which is not followed (the API "
                    "key must not travel to another address). Set base_url to the final address.",
                    status=status,
                    detail=where,
                )
            if status >= 400:
                detail = error_message(raw)
                raise OpenAIHTTPError(
                    f"POST {url} answered HTTP {status} (a client error, not retried): {detail}{self._hint(status)}",
                    status=status,
                    detail=detail,
                )
            try:
                data = json.loads(raw)
            except ValueError as exc:
                last_error, retry_after = f"the response is not valid JSON ({exc}; {len(raw)} bytes)", None
                continue
            if not isinstance(data, dict):
                last_error, retry_after = f"the response is JSON {type(data).__name__}, not an object", None
                continue
            return data
        raise OpenAIRequestError(
            f"POST {url} (model {s.model!r}) failed after {attempts} attempt(s) "
            f"({s.max_retries} retries, deadline {s.timeout}s each): {last_error}"
        )

    async def _attempt(self, url: str, body: dict[str, Any]) -> tuple[int, httpx2.Headers, bytes]:
        """One POST, from sending the request to the last byte of the answer."""
        async with self._client.stream("POST", url, json=body, headers=self._headers) as response:
            return response.status_code, response.headers, await response.aread()

    def _hint(self, status: int) -> str:
        s = self.settings
        if status == 404:
            return f". Check base_url ({s.base_url!r}) and model ({s.model!r})."
        if status in (401, 403):
            return f". Set the API key in ${s.api_key_env} (or pass api_key=)."
        return ""


def _retry_after(headers: httpx2.Headers) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
