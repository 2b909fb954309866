"""The engine's event loop: where ``async def`` env hooks run.

One loop per process, in a daemon thread of its own, started on first use and reused by every run
(so an env's loop-bound resources, e.g. an HTTP client session, stay valid across runs). It is never
the caller's loop: ``generate_rollouts`` works the same from a plain script and from inside a running
loop (a notebook cell), and an env's coroutines never run on a loop the caller is blocking.

Rule for async hooks: they must not block the loop (no ``time.sleep``, no blocking I/O, no heavy
CPU work inside ``async def``): every waiting episode of the process shares this one thread. Put
blocking work in a sync hook, which the engine runs on its worker threads.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


class EngineLoop:
    """The process's engine loop (see the module docstring); a fork gets a fresh one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="hf-rollouts-loop", daemon=True)
                self._thread.start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def in_loop_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def submit(self, awaitable: Awaitable[T]) -> Future:
        """Run ``awaitable`` on the loop; a ``concurrent.futures.Future`` of its result (``cancel()`` cancels it)."""
        return asyncio.run_coroutine_threadsafe(_await(awaitable), self.loop())


ENGINE_LOOP = EngineLoop()


def resolve(value: Any) -> Any:
    """``value``, or, when it is awaitable (an ``async def`` hook's coroutine), its result, awaited on the engine
    loop. For synchronous callers outside the engine (``run_episode``, ``check_env``)."""
    if not inspect.isawaitable(value):
        return value
    if ENGINE_LOOP.in_loop_thread():
        raise RuntimeError(
            "an async env hook was resolved synchronously from inside the engine's event loop; call the synchronous "
            "entry points (run_trial, generate_rollouts, check_env) from ordinary code, not from an async hook."
        )
    return ENGINE_LOOP.submit(value).result()
