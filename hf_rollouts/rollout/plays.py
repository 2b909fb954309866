"""What one engine run (:mod:`.engine`) keeps per generator it advances, per group and per worker thread.

A :class:`Play` is one generator the engine advances: an episode (:func:`~.episode.episode_steps`, or an env's own
``_run_complete_episode`` through :func:`~.episode.door_steps`) or a group's reward step (:func:`~.group.group_steps`).
At any moment it is in exactly one :class:`Phase`; only the engine changes it, under the engine's lock.
"""

from __future__ import annotations

import asyncio
import math
import queue
from concurrent.futures import Future
from enum import Enum
from typing import Any

from ..types import AgentRequest, Episode
from .episode import EpisodeTimeout, HookClock
from .group import as_error, group_error, settle_solved
from .jobs import EpisodeJob, GroupJob
from .recorder import EpisodeRecorder


class Phase(Enum):
    """Where an episode (or a group's reward step) is; see the module docstring."""

    QUEUED = "queued"
    RUNNING = "running"
    AWAITING = "awaiting"
    ASKING = "asking"
    DONE = "done"


START = object()  # the value that starts a generator


class Play:
    """One generator the engine advances (an episode, or a group's reward step) and what it waits for."""

    __slots__ = ("steps", "clock", "phase", "value", "request", "pending", "worker", "group", "member", "job")
    __slots__ += ("recorder", "reply", "env_class")

    def __init__(self, clock: HookClock, group: RunGroup, member: int | None) -> None:
        self.clock, self.group, self.member = clock, group, member  # member: None for the group's reward step
        self.job: EpisodeJob | None = None if member is None else group.job.jobs[member]
        self.steps: Any = None
        self.phase, self.value = Phase.QUEUED, START
        self.request: AgentRequest | None = None
        self.pending: asyncio.Future | None = None  # the agent's answer or an async hook, awaited on the loop
        self.worker: Worker | None = None
        self.recorder: EpisodeRecorder | None = None
        self.reply: Future | None = None  # a door's request: its worker waits here for the answer
        self.env_class = type(group.job.env)

    def advance(self) -> Any:
        """Run until the next yield (an :class:`AgentRequest` or a :class:`HookAwait`) or the end (the generator's
        result: an :class:`Episode`, or the group step's list of them). On a worker."""
        value, self.value = self.value, None
        try:
            if value is START:
                return next(self.steps)
            if self.clock.spent() and not isinstance(value, BaseException):
                value = EpisodeTimeout(f"episode_timeout: the episode ran over {self.clock.episode_limit} s")
            if isinstance(value, BaseException):
                return self.steps.throw(value)
            return self.steps.send(value)
        except StopIteration as stop:
            return stop.value

    def timed_out(self, message: str) -> Any:
        """The result of a play abandoned in a stuck sync hook: a copy of what it recorded so far, as ``error``."""
        if self.job is None:  # the group step: every rollout it was given fails
            env, error = self.group.job.env, group_error(self.group.job.env, EpisodeTimeout(message))
            return settle_solved(env, [e if e.status == "error" else as_error(e, error) for e in self.group.episodes])
        if self.recorder is None:  # a door: nothing recorded here
            return Episode([], [], [], [], None, math.nan, "error", message, 0, 0, [], [])
        return self.recorder.snapshot_error(message)


class RunGroup:
    """A group being played: its episodes as they finish, and its limits (``(step_limit, episode_limit)``)."""

    __slots__ = ("job", "index", "episodes", "left", "limits")

    def __init__(self, job: GroupJob, index: int, limits: tuple) -> None:
        self.job, self.index, self.limits = job, index, limits
        self.episodes: list[Episode | None] = [None] * len(job.jobs)
        self.left = len(job.jobs)


class Worker:
    """A worker thread serving one run. ``active``: woken and not yet rested since; ``held``: waiting inside a door
    for an answer (not counted against the width); ``play``: what it advances now."""

    __slots__ = ("inbox", "active", "held", "abandoned", "play", "taken")

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.active = self.held = self.abandoned = False
        self.play: Play | None = None
        self.taken = 0


__all__ = ["START", "Phase", "Play", "RunGroup", "Worker"]
