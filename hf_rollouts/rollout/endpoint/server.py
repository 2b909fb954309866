"""The HTTP server: one per process, on the engine loop (:mod:`hf_rollouts.aio`), bound to 127.0.0.1 only (and, for
sandboxed programs, a Unix socket in a private directory), started on first use and shared by every episode.

Each episode opens a :class:`Session` with a key of its own (``secrets.token_urlsafe``): a request is routed by its
``Authorization: Bearer KEY`` header, so concurrent episodes never mix, and a key is refused (401) from the moment
its episode ends, so a program that goes on calling cannot write into it. A request is checked here
(:class:`~.protocol.ChatRequest`: 400 / 404 answered at once) and handed to its episode as a :class:`Call`; the
episode (:mod:`.steps`) renders the prompt, asks the run's agent like any other episode's request (so calls of many
programs batch together) and answers the call. Routes: ``POST /v1/chat/completions``, ``GET /v1/models`` (and
``/v1/models/{name}``); ``POST /v1/responses`` and ``/v1/completions`` answer 404 saying to use Chat Completions;
anything else 404 in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ...aio import ENGINE_LOOP
from .protocol import APIError, ChatRequest, completion_body, model_card, model_list, parse_json, stream_chunks


@dataclass(frozen=True)
class EndpointAddress:
    """Where a program reaches its episode: ``base_url`` (``http://127.0.0.1:PORT/v1``), its ``api_key``, the
    ``model`` name to send, and ``socket`` (the Unix socket serving the same routes, for a sandboxed program)."""

    base_url: str
    api_key: str
    model: str
    socket: str | None = None


@dataclass
class Call:
    """One chat-completions request of a program, waiting for its episode to answer it."""

    request: ChatRequest
    future: asyncio.Future

    def respond(self, value: Any) -> None:
        """Answer the call (a ``(Reply, id)`` pair, or an :class:`~.protocol.APIError`) from any thread."""
        self.future.get_loop().call_soon_threadsafe(_settle, self.future, value)


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():  # the client went away: nobody reads it
        future.set_result(value)


class Session:
    """One episode's door: its key and served model name, and the events (calls, the program's end) it has not
    taken yet. Events are pushed on the loop and taken by the episode's generator on whatever thread advances it."""

    def __init__(self, model: str, sampling_fields: str = "record") -> None:
        self.key = "hfr-" + secrets.token_urlsafe(18)
        self.model, self.sampling_fields = model, sampling_fields
        self._lock = threading.Lock()
        self._events: deque[Any] = deque()
        self._waiter: asyncio.Future | None = None
        self.closed = False

    def push(self, event: Any) -> bool:
        """Hand ``event`` to the episode (on the loop); ``False`` when the session is closed."""
        with self._lock:
            if self.closed:
                return False
            waiter, self._waiter = self._waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(event)
            else:
                self._events.append(event)
            return True

    def next_event(self) -> tuple[Any, asyncio.Future | None]:
        """``(event, None)`` when one is waiting, else ``(None, future)``: a future of the next event to await."""
        with self._lock:
            if self._events:
                return self._events.popleft(), None
            self._waiter = ENGINE_LOOP.loop().create_future()
            return None, self._waiter

    def close(self, error: APIError) -> None:
        """Refuse what comes next; answer the calls still waiting with ``error``."""
        with self._lock:
            self.closed = True
            left, self._events = list(self._events), deque()
            waiter, self._waiter = self._waiter, None
        for event in left:
            if isinstance(event, Call):
                event.respond(error)
        if waiter is not None:
            waiter.get_loop().call_soon_threadsafe(waiter.cancel)


def _error(exc: APIError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


class EndpointServer:
    """The process's endpoint (see the module docstring): :meth:`open` a session, :meth:`close` it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self.sessions: dict[str, Session] = {}
        self.base_url: str | None = None
        self.socket: str | None = None
        self._runner: web.AppRunner | None = None

    def open(self, session: Session, *, unix: bool = False) -> EndpointAddress:
        """Register ``session`` (starting the server on first use); its address. ``unix``: also serve the Unix
        socket. Not on the engine loop (it waits for the server to start)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's server is not ours
                self._pid, self._runner, self.base_url, self.socket, self.sessions = os.getpid(), None, None, None, {}
            if self._runner is None:
                ENGINE_LOOP.call(self._start())
            if unix and self.socket is None:
                ENGINE_LOOP.call(self._start_unix())
            self.sessions[session.key] = session
        return EndpointAddress(self.base_url or "", session.key, session.model, self.socket if unix else None)

    def close(self, session: Session, reason: str) -> None:
        """The episode ended: its key is refused from now on, waiting calls get a 401 with ``reason``."""
        with self._lock:
            self.sessions.pop(session.key, None)
        session.close(_ended(reason))

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{name:.+}", self._model)
        app.router.add_post("/v1/responses", self._not_served)
        app.router.add_post("/v1/completions", self._not_served)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))  # loopback only; the port is chosen by the system
        await web.SockSite(runner, sock).start()
        self._runner, self.base_url = runner, f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    async def _start_unix(self) -> None:
        folder = tempfile.mkdtemp(prefix="hf-rollouts-endpoint-")
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "endpoint.sock")
        site = web.UnixSite(self._runner, path)  # type: ignore[arg-type]
        await site.start()
        os.chmod(path, 0o777)  # a sandboxed program may run as another uid; the key still guards every session
        self.socket = path

    def _session(self, request: web.Request) -> Session:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        session = self.sessions.get(key)
        if session is None:
            shown = f"{key[:8]}..." if key else "none"
            raise APIError(
                401, f"Incorrect API key provided: {shown}. Each episode has its own key (its program's "
                "endpoint.api_key), valid while the episode runs.", code="invalid_api_key",
            )  # fmt: skip
        return session

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            session = self._session(request)
            chat = ChatRequest.parse(parse_json(await request.read()), session.model, session.sampling_fields)
        except APIError as exc:
            return _error(exc)
        call = Call(chat, asyncio.get_running_loop().create_future())
        if not session.push(call):
            return _error(_ended("the episode has ended"))
        answer = await call.future
        if isinstance(answer, APIError):
            return _error(answer)
        reply, call_id = answer
        if not chat.stream:
            return web.json_response(completion_body(reply, call_id, session.model))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        await response.write(b"".join(stream_chunks(reply, call_id, session.model, chat.include_usage)))
        await response.write_eof()
        return response

    async def _models(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(model_list(self._session(request).model))
        except APIError as exc:
            return _error(exc)

    async def _model(self, request: web.Request) -> web.Response:
        try:
            model = self._session(request).model
        except APIError as exc:
            return _error(exc)
        name = request.match_info["name"]
        if name != model:
            return _error(APIError(404, f"The model `{name}` does not exist.", code="model_not_found", param="model"))
        return web.json_response(model_card(model))

    async def _not_served(self, request: web.Request) -> web.Response:
        return _error(
            APIError(
                404,
                f"{request.path} is not served here: this endpoint serves the Chat Completions API only. Use "
                "POST /v1/chat/completions (openai: client.chat.completions.create; the Agents SDK: "
                "OpenAIChatCompletionsModel).",
                code="unsupported_endpoint",
            )  # fmt: skip
        )

    async def _unknown(self, request: web.Request) -> web.Response:
        return _error(APIError(404, f"Invalid URL ({request.method} {request.path})", code="unknown_url"))


def _ended(reason: str) -> APIError:
    return APIError(401, f"This key's episode is over ({reason}); it no longer accepts calls.", code="invalid_api_key")


ENDPOINT = EndpointServer()
"""The process's endpoint server."""
