"""Episodes to play: which env, which task, which rollout, with which seed; and the door for envs that override
``_run_complete_episode``."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from ..agents.base import Agent
from ..seeding import derive_seed
from ..types import Action, AgentRequest, reward_rule_violation
from .episode import HookClock, Steps


class PlaysEpisodes(Protocol):
    """An environment as the engine sees it: its config and its door to one episode."""

    env_config: dict[str, Any]

    def _run_complete_episode(
        self, session_id: str, agent: Agent, task_data: dict[str, Any], *, on_error: str = ...
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: which env, which task, which rollout, and its sampling seed (``None``: unseeded)."""

    env: PlaysEpisodes
    task_data: dict[str, Any]
    session_id: str
    order: int
    seed: int | None = None


def episode_jobs(
    env: PlaysEpisodes,
    task_data_list: list[dict[str, Any]],
    num_rollouts: int,
    *,
    prefix: str = "",
    start: int = 0,
    seed: int | None = None,
) -> list[EpisodeJob]:
    """The ``len(task_data_list) * num_rollouts`` episodes of a trial, task-major.

    With ``seed``, episode ``(t, r)`` gets the seed ``derive_seed(seed, t, r)`` and its turn ``k`` the request
    seed ``derive_seed(that, k)``: a function of the task and rollout only, not of scheduling.
    """
    return [
        EpisodeJob(
            env,
            task,
            f"{prefix}task{t}/rollout{r}",
            start + t * num_rollouts + r,
            None if seed is None else derive_seed(seed, t, r),
        )  # fmt: skip
        for t, task in enumerate(task_data_list)
        for r in range(num_rollouts)
    ]


def custom_door(job: EpisodeJob, on_error: str, clock: HookClock) -> Steps:
    """An env that overrides ``_run_complete_episode``: run the override in a thread of its own, and yield the
    requests it makes so the engine answers them like any other. The override's work between two requests is
    timed by ``clock`` as one hook, ``_run_complete_episode``."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    class _Relay(Agent):
        def get_action(self, messages, agent_state=None):  # pragma: no cover - act is always used
            raise NotImplementedError

        def act(self, request: AgentRequest) -> tuple[Action, Any]:
            outbox.put(("request", request))
            kind, value = inbox.get()
            if kind == "error":
                raise value
            return value

    def play() -> None:
        try:
            outbox.put(
                ("done", job.env._run_complete_episode(job.session_id, _Relay(), job.task_data, on_error=on_error))
            )
        except BaseException as exc:
            outbox.put(("raise", exc))

    threading.Thread(target=play, name=f"hf-rollouts-{job.session_id}", daemon=True).start()
    while True:
        kind, value = clock.call("_run_complete_episode", outbox.get)
        if kind == "done":
            problem = reward_rule_violation(value["status"], value["final_reward"], value["per_token_rewards"])
            if problem:  # the engine's own episodes pass through the recorder, which enforces the rule
                raise RuntimeError(
                    f"episode {job.session_id} of {type(job.env).__name__} breaks the reward rule ({problem}); "
                    "an environment must not override _run_complete_episode to bypass the recorder."
                )
            return value
        if kind == "raise":
            raise value
        try:
            inbox.put(("answer", (yield value)))
        except Exception as exc:
            inbox.put(("error", exc))
