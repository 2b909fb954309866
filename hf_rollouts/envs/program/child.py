"""The process an agent program runs in (run as a script: it imports the standard library only, never hf_rollouts).

It reads its job as JSON on stdin (``program``, ``base_url``, ``api_key``, ``model``, ``task``, ``result``: the file
to write its outcome to, ``socket``: a Unix socket when it runs sandboxed, and ``uid``: the unprivileged uid to become
first, as root in the sandbox, with ``harness``: the code sandbox's harness file, whose ``drop_privileges`` does it),
imports the program, calls it as
``program(endpoint, task)`` (awaited when it is ``async def`` or returns an awaitable) and writes
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "Type: message", "traceback": ...}`` to the result file.
The program's prints go to stderr (stdout belongs to nobody), which the host keeps the end of.

In a sandbox without a network (:mod:`hf_rollouts.envs.program.launch`) the endpoint is reached through ``socket``:
a small bridge listens on the sandbox's own loopback and forwards each connection to the socket, so the program's
``base_url`` is an ordinary ``http://127.0.0.1:PORT/v1`` and any client works unchanged.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import socket
import sys
import threading
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgramEndpoint:
    """What a program is handed: ``base_url`` (``http://127.0.0.1:PORT/v1``), ``api_key`` (its episode's key) and the
    ``model`` name to send, e.g. ``openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)``."""

    base_url: str
    api_key: str
    model: str


def load(spec: str):  # noqa: ANN201 - the program, whatever it is
    """``package.module:function`` (or ``package.module.function``) imported."""
    module, sep, name = spec.partition(":")
    if not sep:
        module, _, name = spec.rpartition(".")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def bridge(path: str) -> int:
    """Listen on 127.0.0.1 (the sandbox's own loopback) and forward every connection to the Unix socket ``path``;
    the port."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(256)

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(path)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]


def drop_privileges(job: dict) -> None:
    """As root in the sandbox, become the job's unprivileged ``uid`` before anything of the program runs, with the
    code sandbox's own ``drop_privileges`` (the harness file ``job["harness"]``, loaded by path: standard library
    only, like this script)."""
    if job.get("uid") is None:
        return
    spec = importlib.util.spec_from_file_location("hf_rollouts_harness", job["harness"])
    assert spec is not None and spec.loader is not None, job["harness"]
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    harness.drop_privileges(job["uid"])


def main() -> int:
    job = json.loads(sys.stdin.read())
    drop_privileges(job)
    os.dup2(2, 1)  # the program's prints go to stderr
    base_url = job["base_url"]
    if job.get("socket"):
        base_url = f"http://127.0.0.1:{bridge(job['socket'])}/v1"
    endpoint = ProgramEndpoint(base_url, job["api_key"], job["model"])
    try:
        program = load(job["program"])
        result = asyncio.run(program(endpoint, job["task"])) if inspect.iscoroutinefunction(program) else None
        if not inspect.iscoroutinefunction(program):
            result = program(endpoint, job["task"])
            if inspect.isawaitable(result):
                result = asyncio.run(_wait(result))
        outcome = {"ok": True, "result": result}
        text = json.dumps(outcome)
    except BaseException as exc:  # noqa: BLE001 - whatever the program raised is its outcome
        if isinstance(exc, TypeError) and "JSON serializable" in str(exc):
            exc = TypeError(f"the program returned a value JSON cannot hold: {exc}")
        tb = "".join(traceback.format_exception(exc)[-6:])
        text = json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": tb})
    with open(job["result"], "w") as f:
        f.write(text)
    return 0


async def _wait(awaitable):  # noqa: ANN001, ANN202
    return await awaitable


if __name__ == "__main__":
    sys.exit(main())
