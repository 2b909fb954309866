"""How many worker threads an env's episodes get (the offload policy), and the collector kept off the old heap.

Sync code of an episode (its env's sync hooks, the recorder, the chat template) runs on worker threads, never on the
engine loop: a Python thread cannot be stopped, so a sync hook that hangs must hang a thread the engine can abandon,
not the loop every episode shares. One worker advances the waiting episodes one after another, so CPU-bound hooks
cost a generator step each (measured: about 0.26 us, against about 52 us for handing one call to another thread)
and never fight over the GIL; only hooks that *block* (I/O: a server, a sandbox, a judge) make the waiting episodes
worth more workers, up to ``env_workers``. :class:`OffloadPolicy` decides that, per env class, from what its hooks
did. The threads themselves are the process's reusable ones (:data:`hf_rollouts.aio.THREADS`).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

DEFAULT_ENV_WORKERS = 32
"""Worker threads that run sync env hooks at once (``env_workers``). I/O-bound hooks overlap up to this many;
CPU-bound Python hooks gain nothing from more threads (the GIL) and lose little."""


class OffloadPolicy:
    """Whether an env's episodes get workers of their own, from what its hooks did (one per process).

    An env class is *blocking* once one of its sync hooks was seen stuck: a worker sat inside it for ``STALL`` seconds
    while other episodes waited for a worker and no worker took any (the engine looks every :attr:`look` seconds while
    that could happen). From then on each of its waiting episodes gets a worker at once, up to ``env_workers``. Other
    envs' episodes share one worker. :attr:`look` starts at ``STALL`` and doubles (up to ``LOOK_MAX``) after every look
    that found progress, so a CPU-bound env, whose worker always progresses, is rarely looked at (a look takes the GIL
    from the busy worker), and it drops back to ``STALL`` after a stall.
    """

    STALL = 0.001
    LOOK_MAX = 0.016

    def __init__(self) -> None:
        self.blocking: set[type] = set()
        self.look = self.STALL

    def blocks(self, env_class: type) -> bool:
        return env_class in self.blocking

    def stalled(self, env_classes: set[type]) -> None:
        self.blocking |= env_classes
        self.look = self.STALL

    def progressed(self) -> None:
        self.look = min(self.LOOK_MAX, self.look * 2)


POLICY = OffloadPolicy()


_frozen_lock = threading.Lock()
_frozen_runs = 0


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Keep the garbage collector off the objects that existed before the run, for the run's duration.

    Many live episodes keep many objects alive at once, which makes CPython run full collections; each one scans the
    whole process heap (torch, transformers, datasets: about 0.25 s here), and with a fast agent they were the
    engine's largest overhead. :func:`gc.freeze` moves the existing objects out of the collector's view;
    :func:`gc.unfreeze` at the end gives them back, so garbage among them is still collected, just after the run.
    Runs may nest or overlap (the first freezes, the last unfreezes), and nothing is done when the caller froze the
    heap already or disabled the collector.
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
