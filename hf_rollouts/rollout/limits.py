"""The engine's time limits: each env's ``step_timeout`` / ``episode_timeout`` and the look that enforces them.

:func:`env_limits` resolves each env's limits (``env_config`` wins over the run's defaults). :class:`TimeLimits` is the
part of the engine (:class:`~.engine._Engine` inherits it) that ends what ran past its limit: on the engine loop, under
the engine's lock, it asks each live play's :class:`~.episode.HookClock` for its verdict once
(:meth:`~.episode.HookClock.expire`), then looks again when a limit could next pass. What each verdict does (a sync
hook's worker abandoned, an awaited request or hook cancelled) is described in :mod:`.engine`'s docstring.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from .episode import EpisodeTimeout, HookClock
from .plays import Phase, Play, Worker

LIMIT_KEYS = ("step_timeout", "episode_timeout")
"""The ``env_config`` keys (and run options) of the two limits, in the order of a limits tuple."""


def limit_value(value: Any) -> float | None:
    """A limit in seconds, ``None`` for no limit (``0`` and ``None`` alike)."""
    return float(value) if value else None


def env_limits(envs: list[Any], step_timeout: Any, episode_timeout: Any) -> dict[int, tuple[float | None, ...]]:
    """``id(env) -> (step_limit, episode_limit)`` for each env: its ``env_config`` values, else the run's."""
    limits: dict[int, tuple[float | None, ...]] = {}
    for env in envs:
        if id(env) not in limits:
            config = getattr(env, "env_config", {})
            limits[id(env)] = tuple(
                limit_value(config.get(k, d)) for k, d in zip(LIMIT_KEYS, (step_timeout, episode_timeout))
            )
    return limits


class TimeLimits:
    """The engine's enforcement of time limits (see the module docstring). It reads and changes the engine's state
    (``alive``, ``workers``, ``floor``, ``stopped``, ``loop``, ``police_at``, ``police_timer``) and finishes or
    answers plays through the engine (``_finish``, ``_answered``, ``_safe``): every call runs under the engine's
    lock, on the loop, except :meth:`alarm`, which only schedules a look."""

    alive: set[Play]
    workers: list[Worker]
    floor: float
    stopped: bool
    loop: asyncio.AbstractEventLoop
    police_at: float
    police_timer: asyncio.TimerHandle | None
    _safe: Callable[..., None]
    _finish: Callable[[Play, Any], None]
    _answered: Callable[[Play, Any], None]

    def alarm(self, play: Play, _clock: HookClock) -> None:
        """An activity of ``play`` began (any thread): look sooner if it could run over before the next look."""
        if play.clock.due() < self.police_at:
            self.loop.call_soon_threadsafe(self._safe, self.police)

    def police(self) -> None:
        """On the loop: end what ran past its limit (see the module docstring), then look again when a limit could
        next pass: an activity that begins later cannot pass its step limit before ``floor`` (the smallest limit)
        from now, and one whose episode has less budget left than that rings :meth:`alarm`."""
        if self.stopped or self.floor == math.inf:
            return
        now = time.monotonic()
        for play in list(self.alive):
            # one read: a hook that returns meanwhile either returned before it (nothing passed) or was cancelled
            message, cancelled = play.clock.expire(now, play.phase is Phase.RUNNING)
            if message is None:
                continue
            if cancelled:  # a sync hook: abandon its worker (if the hook ever returns, its episode stops there)
                play.worker.abandoned = True
                self.workers.remove(play.worker)
                self._finish(play, play.timed_out(message))
            elif play.pending is not None:  # an async hook or a per-request agent: cancel it
                play.pending.cancel()
                play.pending = None
                play.clock.end()
                self._answered(play, EpisodeTimeout(message))
        if self.stopped:
            return
        if self.police_timer is not None:
            self.police_timer.cancel()
        self.police_at = min([now + self.floor, *(p.clock.due() for p in self.alive)]) + 0.001
        self.police_timer = self.loop.call_at(self.police_at, self._safe, self.police)


__all__ = ["LIMIT_KEYS", "TimeLimits", "env_limits", "limit_value"]
