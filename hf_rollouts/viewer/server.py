"""The viewer's local web server (the standard library's ``ThreadingHTTPServer``) and its one-file HTML export.

The server answers a fixed set of addresses: the page, its two assets (read from the package, by name) and the JSON
API of :mod:`hf_rollouts.viewer.api`. No address maps to a file path, so nothing outside the dataset is served; it
binds loopback (``127.0.0.1``; ``::1`` serves IPv6) unless told otherwise and, on loopback, answers only requests whose
``Host`` names a loopback address (any of 127.0.0.0/8, ``::1``, ``localhost``; with the port it serves, or none): a
page on another site cannot read it through DNS rebinding. A connection that has not sent its whole request within
``timeout`` seconds (one that sends nothing, or trickles its headers) is closed, and so is one that makes no progress
for that long while the answer is sent. An answer that fails is a 500 with its reason, never a dropped connection.
Model text reaches the page only as JSON and is put on it with ``textContent`` (``app.js``); the page's
Content-Security-Policy allows no inline or foreign script.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import math
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import api
from .compare import Pairing, compare
from .source import Opened, TaskIndex, task_keys

ASSETS = {
    "/": ("index.html", "text/html"),
    "/app.js": ("app.js", "text/javascript"),
    "/app.css": ("app.css", "text/css"),
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
MAX_HTML_TASKS = 500
"""The most tasks ``--html`` embeds (every group and rollout goes into the one file); serve a larger dataset."""
TIMEOUT = 20.0
"""Seconds a connection has to send its whole request, and the longest wait for any read or write on it."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind, or a ``Host`` header's name without its port) names this machine
    only: ``localhost``, any of 127.0.0.0/8, ``::1`` (bracketed or not; an IPv4-mapped ``::ffff:127.x`` too)."""
    name = host.strip().rstrip(".").lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def split_host(header: str) -> tuple[str, int | None] | None:
    """A ``Host`` header as (name, port or None): ``127.0.0.1:8000``, ``localhost``, ``[::1]:8000``, ``[::1]``, a
    bare ``::1``; None when it cannot be read (a port that is not a number, an unclosed bracket)."""
    header = header.strip()
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    elif header.count(":") == 1:
        name, _, port = header.partition(":")
    else:  # no port, or a bare IPv6 address
        name, port = header, ""
    if port and not port.isdigit():
        return None
    return name, int(port) if port else None


def host_allowed(header: str, port: int) -> bool:
    """Whether a loopback server on ``port`` answers a request whose ``Host`` is ``header``: a loopback name, with
    ``port`` or no port. Any other name is refused (DNS rebinding gives a page elsewhere its own name here)."""
    parts = split_host(header)
    return parts is not None and is_loopback(parts[0]) and parts[1] in (None, port)


def asset(name: str) -> str:
    return resources.files("hf_rollouts.viewer").joinpath("static", name).read_text(encoding="utf-8")


class Viewer:
    """The viewer's state: the dataset (and the one compared with it), their task indexes, the card statistics
    (computed in a background thread: they read every rollout) and the answers to each API address."""

    def __init__(self, main: Opened, other: Opened | None = None, background: bool = True) -> None:
        self.sources = [main] + ([other] if other is not None else [])
        self.indexes = [TaskIndex.build(s.dataset) for s in self.sources]
        self.pairing = Pairing.build(task_keys(main.dataset), task_keys(other.dataset)) if other is not None else None
        self._stats: list[list[list[str]] | None] = [None] * len(self.sources)
        self.stats_error: str | None = None
        self._thread = threading.Thread(target=self._compute_stats, daemon=True)
        if background:
            self._thread.start()
        else:
            self._compute_stats()

    def _compute_stats(self) -> None:
        try:
            for n, source in enumerate(self.sources):
                self._stats[n] = api.stats_table(source)
        except Exception as exc:  # shown on the run page instead of a table that never comes
            self.stats_error = f"{type(exc).__name__}: {exc}"

    def answer(self, path: str, params: dict[str, list[str]]) -> Any:
        """The JSON answer of API address ``path`` (``/api/...``) for query ``params``; ``KeyError`` for an unknown
        address, ``ValueError``/``IndexError`` for bad parameters."""
        n = int(params.get("ds", ["0"])[0])
        if not 0 <= n < len(self.sources):
            raise IndexError(f"ds={n}: this viewer shows {len(self.sources)} dataset(s)")
        source, index = self.sources[n], self.indexes[n]
        if path == "/api/info":
            return {"datasets": [s.label for s in self.sources], "compare": self.pairing is not None}
        if path == "/api/summary":
            out = api.summary(source, index, self._stats[n])
            out["stats_error"] = self.stats_error
            return out
        if path == "/api/tasks":
            return api.tasks(source, index, api.TaskQuery.parse(params))
        if path == "/api/group":
            return api.group(source, int(params["row"][0]))
        if path == "/api/rollout":
            return api.rollout(source, int(params["row"][0]), int(params["i"][0]))
        if path == "/api/compare" and self.pairing is not None:
            return compare(self.pairing, self.indexes[0], self.indexes[1], params)
        raise KeyError(path)


def _clean(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _json(value: Any) -> bytes:
    return json.dumps(_clean(value), allow_nan=False, default=_default).encode()


def _default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


def _handler(viewer: Viewer, port: int | None, timeout: float) -> type[BaseHTTPRequestHandler]:
    """The request handler: ``port`` set, requests are answered only for a loopback ``Host`` (:func:`host_allowed`)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "hf-rollouts-viewer"
        sys_version = ""

        def setup(self) -> None:
            self.timeout = timeout  # each read and write on the socket waits at most this long
            super().setup()

        def handle_one_request(self) -> None:
            # the whole request (its line and headers) must come within `timeout`: a trickle of header bytes,
            # each within the socket's timeout, is cut when the deadline passes
            self._lock, self._read, self._expired = threading.Lock(), False, False
            timer = threading.Timer(timeout, self._expire)
            timer.daemon = True
            timer.start()
            try:
                super().handle_one_request()
            finally:
                timer.cancel()

        def _expire(self) -> None:
            with self._lock:
                if self._read:
                    return
                self._expired = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
            pass

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            with self._lock:
                if self._expired:  # cut at the deadline: what was read is no request to answer
                    return
                self._read = True
            if port is not None and not host_allowed(self.headers.get("Host", ""), port):
                self._send(403, b"unknown Host: open the address hf-rollouts view printed", "text/plain")
                return
            url = urlsplit(self.path)
            if url.path in ASSETS:
                name, content_type = ASSETS[url.path]
                self._send(200, asset(name).encode(), content_type)
                return
            if not url.path.startswith("/api/"):
                self._send(404, b"not found", "text/plain")
                return
            try:
                body = _json(viewer.answer(url.path, parse_qs(url.query)))
            except KeyError as exc:
                self._send(404, _json({"error": f"no such address or parameter: {exc}"}), "application/json")
                return
            except (ValueError, IndexError) as exc:
                self._send(400, _json({"error": str(exc)}), "application/json")
                return
            except Exception as exc:  # an answer that fails is said, not a dropped connection
                self._send(500, _json({"error": f"{type(exc).__name__}: {exc}"[:2000]}), "application/json")
                return
            self._send(200, body, "application/json")

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client gone or timed out is no error of the viewer's
            super().handle_error(request, client_address)


class _Server6(_Server):
    address_family = socket.AF_INET6


class ViewerServer:
    """A running viewer: ``url`` is its address; ``close()`` stops it (also a context manager). ``host``: the address
    to bind (an IPv6 one, such as ``::1``, serves IPv6); ``timeout``: see the module docstring."""

    def __init__(self, viewer: Viewer, host: str = "127.0.0.1", port: int = 0, timeout: float = TIMEOUT) -> None:
        self.viewer = viewer
        server = _Server6 if ":" in host else _Server
        self.httpd = server((host.strip("[]"), port), _handler(viewer, None, timeout), bind_and_activate=True)
        self.port = self.httpd.server_address[1]
        shown = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host.strip("[]"), host.strip("[]"))
        self.url = f"http://{f'[{shown}]' if ':' in shown else shown}:{self.port}/"
        loopback = is_loopback(host)
        self.httpd.RequestHandlerClass = _handler(viewer, self.port if loopback else None, timeout)
        self._thread: threading.Thread | None = None

    def start(self) -> ViewerServer:
        """Serve in a background thread (notebooks, tests); :meth:`serve_forever` blocks instead."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown() if self._thread is not None else None
        self.httpd.server_close()

    def __enter__(self) -> ViewerServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def static_answers(viewer: Viewer) -> dict[str, Any]:
    """Every answer the page can ask for, for the one-file export: per dataset its summary, its whole task table
    (with each task's conversation text, searched by the page itself), each group and each rollout."""
    answers: dict[str, Any] = {"info": viewer.answer("/api/info", {})}
    for n, (source, index) in enumerate(zip(viewer.sources, viewer.indexes)):
        if len(index) > MAX_HTML_TASKS:
            raise ValueError(
                f"{source.label} has {len(index)} tasks; --html embeds at most {MAX_HTML_TASKS} (every rollout goes "
                "into the file). Serve it instead (hf-rollouts view PATH), or save a selection of rows first."
            )
        ds = {"ds": [str(n)]}
        answers[f"summary/{n}"] = viewer.answer("/api/summary", ds)
        table = api.tasks(source, index, api.TaskQuery(limit=max(len(index), 1)))
        texts = _conversation_texts(source)
        for record in table["rows"]:
            record["text"] = texts[record["row"]]
        answers[f"tasks/{n}"] = table
        for row in range(len(index)):
            group = api.group(source, row)
            answers[f"group/{n}/{row}"] = group
            for i in range(len(group["rollouts"])):
                answers[f"rollout/{n}/{row}/{i}"] = api.rollout(source, row, i)
    if viewer.pairing is not None:
        answers["compare"] = viewer.answer("/api/compare", {"limit": [str(api.MAX_PAGE)], "sort": ["row"]})
    return answers


def _conversation_texts(source: Opened) -> list[str]:
    if "conversations" not in source.dataset.column_names:
        return [""] * len(source.dataset)
    return [
        "\n".join(m["content"] or "" for rollout in row or [] for m in rollout or [])
        for row in source.dataset.data.column("conversations").to_pylist()
    ]


def render_html(viewer: Viewer) -> str:
    """The whole viewer as one self-contained page (styles, script and every answer inline; nothing is fetched).
    Its Content-Security-Policy allows exactly its own script and style (by hash)."""
    data = _json(static_answers(viewer)).decode()
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # cannot close the tag
    script, style = asset("app.js"), asset("app.css")
    csp = (
        f"default-src 'none'; script-src 'sha256-{_sha256(script)}'; style-src 'sha256-{_sha256(style)}'; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    page = asset("index.html")
    page = page.replace("<!--csp-->", f'<meta http-equiv="Content-Security-Policy" content="{csp}">')
    page = page.replace('<link rel="stylesheet" href="app.css">', f"<style>{style}</style>")
    page = page.replace(
        '<script src="app.js"></script>',
        f'<script type="application/json" id="hfr-data">{data}</script>\n<script>{script}</script>',
    )
    return page


__all__ = [
    "CSP",
    "MAX_HTML_TASKS",
    "TIMEOUT",
    "Viewer",
    "ViewerServer",
    "host_allowed",
    "is_loopback",
    "render_html",
    "split_host",
    "static_answers",
]
