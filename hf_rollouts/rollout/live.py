"""One running episode as the scheduler sees it: its generator, its clock and its time limits."""

from __future__ import annotations

import math
from typing import Any

from ..types import AgentRequest, Episode
from .episode import HookClock, Steps, episode_steps
from .jobs import EpisodeJob, custom_door
from .recorder import EpisodeRecorder

START = object()  # the value that starts an episode's generator
AGENT = "agent"  # the clock's activity while the agent answers an episode's request


class EpisodeTimeout(Exception):
    """An episode ran past ``step_timeout`` or ``episode_timeout``."""


class LiveEpisode:
    """One running episode: its generator, its clock and limits, and what it waits for."""

    __slots__ = ("job", "steps", "recorder", "clock", "step_limit", "episode_limit", "over", "request", "driver")

    def __init__(
        self, job: EpisodeJob, steps: Steps, recorder: EpisodeRecorder | None, clock: HookClock, limits: tuple
    ) -> None:
        self.job, self.steps, self.recorder, self.clock = job, steps, recorder, clock
        self.step_limit, self.episode_limit = limits
        self.over = False  # ended (by itself or the watchdog); a late answer or hook result is dropped
        self.request: AgentRequest | None = None
        self.driver: Any = None  # the worker advancing it right now

    def overrun(self, now: float) -> str | None:
        """Which limit the running activity has passed at ``now`` (a message), or None."""
        clock = self.clock
        if clock.activity is None:
            return None
        if self.step_limit and clock.activity != AGENT and now - clock.since > self.step_limit:
            return f"step_timeout: {clock.activity} ran over {self.step_limit} s"
        if self.episode_limit and not clock.ending and clock.elapsed(now) > self.episode_limit:
            where = "" if clock.activity == AGENT else f" (stuck in {clock.activity})"
            return f"episode_timeout: the episode ran over {self.episode_limit} s{where}"
        return None

    def due(self) -> float:
        """The moment the running activity would pass a limit (inf: never, or nothing runs)."""
        clock = self.clock
        if clock.activity is None:
            return math.inf
        due = math.inf
        if self.step_limit and clock.activity != AGENT:
            due = clock.since + self.step_limit
        if self.episode_limit and not clock.ending:
            due = min(due, clock.since + self.episode_limit - clock.used)
        return due


LIMIT_KEYS = ("step_timeout", "episode_timeout")


def limit_of(job: EpisodeJob, key: str, default: float | None) -> float | None:
    value = job.env.env_config.get(key, default) if hasattr(job.env, "env_config") else default
    return float(value) if value else None


def timeout_record(live: LiveEpisode, message: str) -> dict[str, Any]:
    """The error record of an episode whose hook is stuck: a copy of what it recorded so far."""
    if live.recorder is None:
        empty = Episode([], [], [], [], None, math.nan, "error", message, 0, 0, [], [])
        return empty.to_dict()
    return live.recorder.snapshot_error(message).to_dict()


def start_episode(job: EpisodeJob, on_error: str, limits: tuple[float | None, float | None]) -> LiveEpisode:
    """``job`` as a live episode: the engine's own loop (:func:`~.episode.episode_steps`), or, for an env that
    overrides ``_run_complete_episode``, that override relayed through :func:`~.jobs.custom_door`."""
    clock = HookClock()
    door = getattr(job.env, "_run_complete_episode", None)
    if not getattr(door, "engine_door", False):
        return LiveEpisode(job, custom_door(job, on_error, clock), None, clock, limits)
    recorder = EpisodeRecorder(job.env.chat, job.env.reward_placement)
    steps = episode_steps(
        job.env, job.session_id, job.task_data, on_error=on_error, clock=clock, recorder=recorder, seed=job.seed
    )
    return LiveEpisode(job, steps, recorder, clock, limits)
