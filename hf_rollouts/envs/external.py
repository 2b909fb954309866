"""Helpers shared by the adapters of other ecosystems' environments (reasoning-gym, SkyRL-gym, OpenEnv, verifiers).

Each adapter imports its package only when an env is built (:func:`import_optional`, whose error names the
extra to install) and puts the package's installed version into its ``fingerprint()``
(:func:`package_version`), so cached rollouts are redone when the external env's code changes.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (its PyPI name), or ``None`` when it is not installed."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def import_optional(module: str, *, env: str, extra: str) -> Any:
    """Import ``module`` or raise ``ImportError`` saying which extra of hf_rollouts installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{env} needs the optional dependency {module!r} ({exc}). Install it with: "
            f'pip install "hf_rollouts[{extra}]"'
        ) from exc


class BackgroundLoop:
    """One asyncio event loop in a daemon thread, for adapters whose external client is async (OpenEnv's, verifiers').

    :meth:`run` submits a coroutine and blocks the calling thread (an env hook) until it is done, so every
    connection an episode opens stays bound to this one loop, whichever thread runs the episode's hooks.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or not self._loop.is_running():
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=serve, name=self.name, daemon=True).start()
                ready.wait()
                self._loop = loop
            return self._loop

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """The result of ``coro`` run on the loop (its exception re-raised here); ``timeout`` seconds at most."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def submit(self, coro: Any) -> None:
        """Schedule ``coro`` without waiting (e.g. closing a connection from a finalizer)."""
        if self._loop is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(coro, self._loop)


__all__ = ["BackgroundLoop", "import_optional", "package_version"]
