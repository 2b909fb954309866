"""The engine loop, where everything that waits is awaited, and the reusable threads where blocking work runs.

The rollout engine coordinates every episode on it; ``async def`` env hooks and tools, MCP sessions, OpenEnv
clients, the OpenAI-compatible client and vLLM's ``AsyncLLM`` run on it. One loop per process, in a daemon thread
of its own, started on first use and reused by every run (so loop-bound resources, e.g. an HTTP session, stay valid
across runs); a forked child gets a fresh one. It is never the caller's loop: ``generate_rollouts`` works the same
from a plain script and from inside a running loop (a notebook cell).

Rule for code on the loop: never block it (no ``time.sleep``, no blocking I/O, no heavy CPU work inside
``async def``): every waiting episode of the process shares this one thread. Sync code that needs a result from the
loop calls :meth:`EngineLoop.call` from another thread (an env's sync hooks run on the engine's worker threads, never
on the loop, so they may); called on the loop itself it raises instead of deadlocking.

Blocking work that must not run on the loop (an env's sync hooks, a sync tool call with a time limit) runs on
:data:`THREADS`: daemon threads kept idle between uses and reused, never one new thread per call.

This module sits at the bottom of the package (it imports nothing of it): agents, tools, envs and the engine all
reach the loop and the threads here.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


class EngineLoop:
    """The process's engine loop (see the module docstring)."""

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
        coro = awaitable if isinstance(awaitable, Coroutine) else _await(awaitable)
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    def call(self, awaitable: Awaitable[T], timeout: float | None = None) -> T:
        """Wait for ``awaitable``'s result from a thread other than the loop's (``timeout``: seconds, then
        ``TimeoutError`` and the awaitable is cancelled)."""
        if self.in_loop_thread():
            getattr(awaitable, "close", lambda: None)()  # never awaited: no "coroutine was never awaited" warning
            raise RuntimeError(
                "a blocking call into the engine loop was made from the loop itself, which would wait forever; from "
                "async code, await it instead (an async def hook must not call synchronous entry points such as "
                "run_trial, generate_rollouts, check_env or an agent's act)."
            )
        future = self.submit(awaitable)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise


ENGINE_LOOP = EngineLoop()


class WorkerThreads:
    """Daemon threads kept idle between runs and reused (a new thread per map batch cost about 5% of a run with a fast
    agent, measured with ``scripts/benchmark_endpoint.py``).

    Per-thread settings of the caller that the agent's work depends on are carried over on every use: torch's
    intra-op thread count is per thread once a thread has used it, so a reused thread would otherwise keep the count
    of its first run and ignore a later ``torch.set_num_threads``. A thread abandoned in a hung hook rejoins the idle
    ones only if the hook ever returns.
    """

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):  # threads do not survive a fork (Dataset.map(num_proc=N) forks)
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []
        self._count = 0

    def run(self, work: Callable[[], None], torch_threads: int | None) -> None:
        """Run ``work`` on an idle thread (a new one if none is idle); with ``torch_threads``, set that thread's torch
        intra-op thread count first."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self._count += 1
                inbox = queue.SimpleQueue()
                name = f"hf-rollouts-thread-{self._count}"
                threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True).start()
        inbox.put((work, torch_threads))

    def submit(self, fn: Callable[[], T]) -> Future:
        """Run ``fn()`` on an idle thread; a future of its result. A call nobody waits for any more (past its time
        limit) keeps its thread until it returns; the thread is then reused."""
        future: Future = Future()

        def work() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

        self.run(work, None)
        return future

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            work, torch_threads = inbox.get()
            if torch_threads is not None and torch_threads_now() != torch_threads:
                sys.modules["torch"].set_num_threads(torch_threads)
            work()
            del work  # hold no engine while idle
            with self._lock:
                self._idle.append(inbox)


THREADS = WorkerThreads()


def torch_threads_now() -> int | None:
    """This thread's torch intra-op thread count, if torch is in use (never imported here)."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_num_threads()


def resolve(value: Any) -> Any:
    """``value``, or, when it is awaitable (an ``async def`` hook's coroutine), its result, awaited on the engine loop.
    For synchronous callers (``run_episode``, ``check_env``)."""
    return ENGINE_LOOP.call(value) if inspect.isawaitable(value) else value
