"""Guess the number: find a secret integer with higher/lower hints.

A toy environment small enough for the tiny model to learn on CPU (see
``scripts/train_grpo.py``). ``env_config``: ``low`` (1), ``high`` (10),
``max_turns`` (3), ``seed``. ``task_data``: ``{"target": int}``.

Reward: 1.0 on the step that names the target, 0 otherwise. The action's first
integer is the guess; an action without one gets a hint and costs a turn.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..base import MultistepEnv
from ..config import EnvConfig, EnvConfigError, option
from ..task_data import task_int


@dataclass(frozen=True, kw_only=True)
class GuessNumberConfig(EnvConfig):
    low: int = option(1, "Smallest possible target.")
    high: int = option(10, "Largest possible target.")

    def check(self) -> None:
        super().check()
        if self.low > self.high:
            raise EnvConfigError("high", f"guess_number needs low <= high, got low={self.low}, high={self.high}.")


@dataclass
class GuessState:
    target: int
    last_message: str = ""


class GuessNumberEnv(MultistepEnv):
    name = "guess_number"
    default_max_turns = 3
    default_max_reward = 1.0  # the reward of finding the number
    config_class = GuessNumberConfig

    def __init__(self, tokenizer: PreTrainedTokenizerBase, env_config: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, env_config)
        self.low, self.high = self.config.low, self.config.high

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        # Tasks are (target, variant) pairs so there are enough of them; eval uses odd variants.
        variants = range(1 if split == "eval" else 0, 1000, 2)
        tasks = [{"target": t, "variant": v} for v in variants for t in range(self.low, self.high + 1)]
        self._rng("tasks", split).shuffle(tasks)
        return tasks[:num_tasks] if num_tasks is not None else tasks[: 10 * (self.high - self.low + 1)]

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """``target``: an int in ``[low, high]``."""
        task_int(task_data, "target", "GuessNumberEnv", low=self.low, high=self.high)

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> GuessState:
        return GuessState(target=task_int(task_data, "target", "GuessNumberEnv", low=self.low, high=self.high))

    def _format_prompt(self, state: GuessState, step: int) -> str:
        if step == 0:
            return f"Guess the number between {self.low} and {self.high}. Answer with one number."
        return state.last_message

    def _step_episode(
        self, session_id: str, state: GuessState, action: str
    ) -> tuple[GuessState, float, bool, dict[str, Any]]:
        match = re.search(r"-?\d+", action)
        if match is None:
            state.last_message = f"No number found. Answer with one number from {self.low} to {self.high}."
            return state, 0.0, False, {"valid": False}
        guess = int(match.group())
        if guess == state.target:
            state.last_message = "That is the number."
            return state, 1.0, True, {"valid": True, "correct": True}
        state.last_message = "Higher." if guess < state.target else "Lower."
        return state, 0.0, False, {"valid": True, "correct": False}


@dataclass(frozen=True, kw_only=True)
class WaitingGuessNumberConfig(GuessNumberConfig):
    step_wait_s: float = option(0.2, "Seconds each step waits before it answers (asyncio.sleep).")

    def check(self) -> None:
        super().check()
        if not self.step_wait_s >= 0:
            raise EnvConfigError("step_wait_s", f"step_wait_s must be >= 0, got {self.step_wait_s}.")


class WaitingGuessNumberEnv(GuessNumberEnv):
    """Guess the number with an env step that waits ``step_wait_s`` (0.2 s) on I/O first, as a judge, a tool or a
    remote game would: an ``async`` step (``asyncio.sleep``), so other episodes play while it waits. What
    ``scripts/benchmark_overlap.py`` measures overlapped rounds on; the rules and rewards are
    :class:`GuessNumberEnv`'s."""

    name = "guess_number_waiting"
    config_class = WaitingGuessNumberConfig

    async def _step_episode(
        self, session_id: str, state: GuessState, action: str
    ) -> tuple[GuessState, float, bool, dict[str, Any]]:
        await asyncio.sleep(self.config.step_wait_s)
        return super()._step_episode(session_id, state, action)
