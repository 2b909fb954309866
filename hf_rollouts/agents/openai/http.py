"""A JSON-over-HTTP client for inference servers: pooled connections, retries, a total deadline, no redirects.

Built on ``aiohttp`` (aio-libs' asyncio HTTP client, the one vLLM's and SGLang's own benchmark clients use) instead of
``urllib`` because it gives, out of the box:

* **connection pooling** (keep-alive; at most ``concurrency`` connections), so a run of thousands of requests does
  not open thousands of TCP connections. Its pool hands out an idle connection in constant time, and its HTTP
  parser is compiled: about 0.2 ms of CPU per request at any concurrency on a development machine. ``httpx2``,
  used before, spent 2 ms at 192 requests in flight and 6 ms at 1,024, because its pool (``httpcore2``) scans
  every connection on each request and probes each idle one's socket (``scripts/benchmark_client.py``;
  ``docs/speed.md``);
* **redirects off** per request (``allow_redirects=False``): a 3xx is reported, never followed, so the
  ``Authorization`` header can never be sent to another host;
* ``trust_env=False`` for loopback servers, so a ``HTTP(S)_PROXY`` variable cannot divert them.

**Total deadline.** Socket timeouts bound each operation, so a server that trickles one byte at a time (of its
status line, its headers or its body) would never trip them. Each attempt here has one deadline, ``timeout`` seconds
from the moment it is sent (``asyncio.timeout`` around the whole attempt: connect, send, status line, headers,
body), so it ends at its deadline whichever phase the server stalls in, on whichever connection (proxied or not);
aiohttp's own timeouts are off, so this deadline is the only one.

**Where it runs.** The client is async and lives on the engine loop (:mod:`hf_rollouts.aio`), where the rollout
engine awaits each request: no thread per request. Its session is opened on the loop at the first request.

**Retries.** Connection errors, a missed deadline, HTTP 429 and 5xx, and a 200 whose body is not a JSON object are
retried ``max_retries`` times with exponential backoff (``backoff * 2**k``, capped at ``max_backoff``; a 429's
``Retry-After`` is honoured up to the cap). A 3xx or another 4xx raises :class:`~.settings.OpenAIHTTPError` at once,
with the server's message (vLLM's ``error.message``, SGLang's ``message`` or FastAPI's ``detail``). Transport errors
are named by kind, whatever the library calls them: ``ConnectError`` (nothing listens, DNS, TLS),
``RemoteProtocolError`` (the server closed the connection or cut the answer short), else aiohttp's class name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import urllib.parse
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

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
    (the engine loop, :mod:`hf_rollouts.aio`); not picklable (the agent rebuilds it). A client dropped without
    :meth:`close` has its session closed on that loop when it is garbage-collected.
    """

    def __init__(self, settings: OpenAISettings, api_key: str | None, count: Callable[[str], None]) -> None:
        self.settings = settings
        self._count = count
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._session: aiohttp.ClientSession | None = None  # opened on the loop by the first request
        self._finalizer: weakref.finalize | None = None
        self._slots: asyncio.Semaphore | None = None  # ``concurrency`` attempts in flight; the rest wait, uncharged

    def _open(self) -> aiohttp.ClientSession:
        """The session, opened on the running loop (aiohttp binds it to the loop it is made on)."""
        if self._session is None:
            s = self.settings
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=s.concurrency, limit_per_host=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None),  # the deadline's job
                trust_env=not is_loopback(s.base_url),
            )
            loop = asyncio.get_running_loop()
            self._finalizer = weakref.finalize(self, _close_dropped, self._session, loop, os.getpid())
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if self._finalizer is not None:
            self._finalizer.detach()
        if session is not None:
            await session.close()

    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``url`` with retries; the decoded JSON object, or :class:`OpenAIRequestError`."""
        s = self.settings
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
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
                        status, headers, raw = await self._attempt(url, data)
            except TimeoutError:
                last_error = (
                    f"timed out: the answer did not complete within the {s.timeout}s deadline "
                    "(a slow or trickling server?)"
                )
                retry_after = None
                continue
            except aiohttp.ClientError as exc:  # connection refused/reset, a body cut off, ...
                last_error, retry_after = transport_error(exc), None
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
                answer = json.loads(raw)
            except ValueError as exc:
                last_error, retry_after = f"the response is not valid JSON ({exc}; {len(raw)} bytes)", None
                continue
            if not isinstance(answer, dict):
                last_error, retry_after = f"the response is JSON {type(answer).__name__}, not an object", None
                continue
            return answer
        raise OpenAIRequestError(
            f"POST {url} (model {s.model!r}) failed after {attempts} attempt(s) "
            f"({s.max_retries} retries, deadline {s.timeout}s each): {last_error}"
        )

    async def _attempt(self, url: str, data: bytes) -> tuple[int, Mapping[str, str], bytes]:
        """One POST of the encoded body, from sending the request to the last byte of the answer."""
        async with self._open().post(url, data=data, headers=self._headers, allow_redirects=False) as response:
            return response.status, response.headers, await response.read()

    def _hint(self, status: int) -> str:
        s = self.settings
        if status == 404:
            return f". Check base_url ({s.base_url!r}) and model ({s.model!r})."
        if status in (401, 403):
            return f". Set the API key in ${s.api_key_env} (or pass api_key=)."
        return ""


def transport_error(exc: aiohttp.ClientError) -> str:
    """``exc`` named by kind (see the module docstring), with aiohttp's message and class."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        kind = "ConnectError"
    elif isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        kind = "RemoteProtocolError"
    else:
        kind = type(exc).__name__
    text = str(exc) or type(exc).__name__
    return f"{kind}: {text}" if kind == type(exc).__name__ else f"{kind}: {text} (aiohttp {type(exc).__name__})"


_CLOSING: set[asyncio.Task] = set()  # sessions of dropped clients being closed (a task needs a strong reference)
_INHERITED: list[aiohttp.ClientSession] = []  # a forked child's copies of its parent's sessions, left alone


def _close_dropped(session: aiohttp.ClientSession, loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """A client garbage-collected without ``close()``: close its session on its loop (aiohttp reports an unclosed
    session as an error). In a forked child the session is the parent's: kept, untouched."""
    if session.closed:
        return
    if os.getpid() != pid or loop.is_closed():
        _INHERITED.append(session)
        return

    def close() -> None:
        task = loop.create_task(session.close())
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)

    loop.call_soon_threadsafe(close)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
