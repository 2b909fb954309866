"""Calls from many episodes, one batch: :class:`MicroBatcher` gathers the items awaited on the engine's loop and runs
them through one blocking batch function on a worker thread.

How a batch forms: the first call starts nothing at once; it schedules the batch for the loop's next turn, so every
episode whose verification starts in the same turn (the engine starts a worker's whole hand-over of awaitables in one
callback) joins it. While a batch runs on its thread, new calls wait; when it ends, everything that arrived meanwhile
is the next batch (up to ``max_batch``). One batch is in flight at a time: a model's forward pass is already parallel
inside, and the next batch grows while the current one runs, as a server's continuous batching does.

The batch function gets the items in arrival order and returns one result per item; a result that is an
``Exception`` fails only its own call; an exception raised by the function fails every call of that batch. Nothing
runs on the loop but bookkeeping: the function runs on :data:`hf_rollouts.aio.THREADS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..aio import THREADS

T = TypeVar("T")
R = TypeVar("R")


class MicroBatcher(Generic[T, R]):
    """``await batcher(item)`` -> ``run_batch([..., item, ...])``'s result for that item (see the module docstring).

    ``sizes`` records the size of every batch run (for tests and reports)."""

    def __init__(self, run_batch: Callable[[list[T]], Sequence[R | BaseException]], max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}.")
        self.run_batch, self.max_batch = run_batch, max_batch
        self.sizes: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[T, asyncio.Future]] = []
        self._busy = False

    async def __call__(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # another loop (a forked child's, a test's): nothing of the old one carries over
            self._loop, self._pending, self._busy = loop, [], False
        future = loop.create_future()
        self._pending.append((item, future))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._next)
        return await future

    def _next(self) -> None:
        """Start a batch of what is pending (calls whose waiter was cancelled are dropped), or go idle."""
        pending = [(item, fut) for item, fut in self._pending if not fut.done()]
        batch, self._pending = pending[: self.max_batch], pending[self.max_batch :]
        if not batch:
            self._busy = False
            return
        self.sizes.append(len(batch))
        items = [item for item, _ in batch]
        running = asyncio.wrap_future(THREADS.submit(lambda: self.run_batch(items)), loop=self._loop)
        running.add_done_callback(lambda done: self._settle(batch, done))

    def _settle(self, batch: list[tuple[Any, asyncio.Future]], done: asyncio.Future) -> None:
        try:
            results: Any = done.result()
            if len(results) != len(batch):
                raise RuntimeError(f"a batch function returned {len(results)} results for {len(batch)} items.")
        except BaseException as exc:  # the whole batch failed: every call of it gets the exception
            results = [exc] * len(batch)
        for (_, fut), result in zip(batch, results):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
        self._next()


__all__ = ["MicroBatcher"]
