"""Hidden function: the agent must call a tool to learn ``f(x)``; guessing almost never wins.

Each task hides ``f(x) = a * x + b`` (``task_data = {"a", "b", "x"}``, drawn from ``1..max_coef`` and
``1..max_x``). The prompt asks for ``f(x)``; the only way to know it is the tool ``f`` (``state`` carries the
episode's hidden coefficients). Reward 1.0 when the first integer of the agent's answer (a turn that calls no
tool) is ``f(x)``, else 0; the answer ends the episode. A tool-env toy: small enough to learn on CPU, and
``check_env``'s default actions exercise it through ``_step_episode``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..config import EnvConfigError, option
from ..task_data import task_int
from ..tool_env import ToolEnv, ToolEnvConfig


@dataclass(frozen=True, kw_only=True)
class HiddenFunctionConfig(ToolEnvConfig):
    max_coef: int = option(9, "Coefficients a and b are drawn from 1..max_coef.", ge=1)
    max_x: int = option(9, "The asked-for x is drawn from 1..max_x.", ge=1)

    def check(self) -> None:
        super().check()
        if self.max_coef * self.max_x > 10**6:
            raise EnvConfigError("max_coef", "hidden_function keeps f(x) below 10**6: lower max_coef or max_x.")


@dataclass
class HiddenState:
    a: int
    b: int
    x: int
    calls: int = 0


def hidden_f(state: HiddenState, x: int) -> int:
    """The hidden function f.

    Args:
        x: The integer to evaluate f at.
    """
    state.calls += 1
    return state.a * x + state.b


class HiddenFunctionEnv(ToolEnv):
    name = "hidden_function"
    default_max_turns = 4
    default_max_reward = 1.0  # the reward of the right answer
    config_class = HiddenFunctionConfig
    tools = (hidden_f,)

    def _task_list(self, split: str, num_tasks: int | None) -> list[dict[str, Any]]:
        c = self.config
        tasks = [
            {"a": a, "b": b, "x": x}
            for a in range(1, c.max_coef + 1)
            for b in range(1, c.max_coef + 1)
            for x in range(1, c.max_x + 1)
        ]
        self._rng("tasks").shuffle(tasks)
        half = len(tasks) // 2
        tasks = tasks[:half] if split == "train" else tasks[half:]
        return tasks[:num_tasks] if num_tasks is not None else tasks

    def validate_task_data(self, task_data: dict[str, Any]) -> None:
        """``a``, ``b`` and ``x``: ints."""
        self._initialize_episode("", task_data)

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> HiddenState:
        a, b, x = (task_int(task_data, key, "HiddenFunctionEnv") for key in ("a", "b", "x"))
        return HiddenState(a, b, x)

    def _format_prompt(self, state: HiddenState, step: int) -> str:
        if step == 0:
            return (
                f"A hidden function f is available as the tool hidden_f. What is f({state.x})? Answer with the number."
            )
        return f"Wrong. Use the tool hidden_f to find f({state.x}), then answer with the number."

    def _step_episode(
        self, session_id: str, state: HiddenState, action: str
    ) -> tuple[HiddenState, float, bool, dict[str, Any]]:
        match = re.search(r"-?\d+", action)
        right = match is not None and int(match.group()) == state.a * state.x + state.b
        return state, float(right), right, {"tool_calls": state.calls, "correct": right}
