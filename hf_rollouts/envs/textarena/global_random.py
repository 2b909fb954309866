"""TextArena games draw from the *global* ``random`` (and some from ``numpy.random``); episodes must not share it.

:func:`swapped_global_random` runs a game call (``make`` / ``reset`` / ``step``) under one process-wide lock with the
global generators swapped for the episode's own state (seeded at reset, saved after each call) and the caller's
state restored afterwards. So episodes running concurrently in threads stay reproducible and do not disturb each
other; other code drawing from the global ``random`` in another thread at the same moment is not protected.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

GLOBAL_RANDOM_LOCK = threading.RLock()
"""Serialises every use of the process-wide ``random`` / ``numpy.random`` state by TextArena games."""


def _numpy_random() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with datasets
        return None
    return numpy.random


@contextmanager
def swapped_global_random(holder: Any, seed: int | None = None) -> Iterator[None]:
    """Run the body with the global RNGs set to ``holder``'s state (or seeded with ``seed``), under the lock.

    On exit the new RNG states are saved back into ``holder.random_state`` /
    ``holder.numpy_random_state`` and the caller's global states are restored.
    """
    np_random = _numpy_random()
    with GLOBAL_RANDOM_LOCK:
        saved = random.getstate()
        np_saved = np_random.get_state() if np_random is not None else None
        try:
            if seed is not None:
                random.seed(seed)
                if np_random is not None:
                    np_random.seed(seed % 2**32)
            else:
                random.setstate(holder.random_state)
                if np_random is not None and holder.numpy_random_state is not None:
                    np_random.set_state(holder.numpy_random_state)
            yield
        finally:
            holder.random_state = random.getstate()
            holder.numpy_random_state = np_random.get_state() if np_random is not None else None
            random.setstate(saved)
            if np_random is not None:
                np_random.set_state(np_saved)


__all__ = ["GLOBAL_RANDOM_LOCK", "swapped_global_random"]
