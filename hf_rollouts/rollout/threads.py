"""The engine's threads: driver threads reused across runs, and the collector kept off the pre-existing heap."""

from __future__ import annotations

import gc
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class DriverThreads:
    """Daemon threads that drive runs, kept idle between runs and reused.

    A run's driver may be abandoned in a hung hook (see the module docstring); it rejoins the idle
    ones only if the hook ever returns. Reusing threads matters with a fast agent: a new thread per
    map batch cost about 5% of the run (measured with ``scripts/benchmark_endpoint.py``).

    Per-thread settings of the caller that the agent's work depends on are carried over on every
    run: torch's intra-op thread count is per thread once a thread has used it, so a reused driver
    would otherwise keep the count of its first run and ignore a later ``torch.set_num_threads``.
    """

    def __init__(self) -> None:
        self._reset()
        if hasattr(os, "register_at_fork"):  # threads do not survive a fork (Dataset.map(num_proc=N) forks)
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """Forget every thread: in a forked child, handing a run to the parent's idle threads would wait forever."""
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []
        self._count = 0

    def run(self, drive: Callable[[int], None], epoch: int) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self._count += 1
                inbox = queue.SimpleQueue()
                name = f"hf-rollouts-driver-{self._count}"
                threading.Thread(target=self._serve, args=(inbox,), name=name, daemon=True).start()
        inbox.put((drive, epoch, _torch_threads()))

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            drive, epoch, torch_threads = inbox.get()
            if torch_threads is not None and _torch_threads() != torch_threads:
                sys.modules["torch"].set_num_threads(torch_threads)
            drive(epoch)
            del drive  # hold no engine while idle
            with self._lock:
                self._idle.append(inbox)


DRIVERS = DriverThreads()


def _torch_threads() -> int | None:
    """This thread's torch intra-op thread count, if torch is in use (never imported here)."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_num_threads()


_frozen_lock = threading.Lock()
_frozen_runs = 0


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Keep the garbage collector off the objects that existed before the run, for the run's duration.

    Many live episodes keep many objects alive at once, which makes CPython run full collections; each one
    scans the whole process heap (torch, transformers, datasets: about 0.25 s here), and with a fast agent
    they were the engine's largest overhead. :func:`gc.freeze` moves the existing objects out of the
    collector's view; :func:`gc.unfreeze` at the end gives them back, so garbage among them is still
    collected, just after the run. Runs may nest or overlap (the first freezes, the last unfreezes), and
    nothing is done when the caller froze the heap already or disabled the collector.
    """
    global _frozen_runs
    with _frozen_lock:
        mine = _frozen_runs > 0 or (gc.isenabled() and gc.get_freeze_count() == 0)
        if mine:
            if _frozen_runs == 0:
                gc.freeze()
            _frozen_runs += 1
    try:
        yield
    finally:
        if mine:
            with _frozen_lock:
                _frozen_runs -= 1
                if _frozen_runs == 0:
                    gc.unfreeze()
