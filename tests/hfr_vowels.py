"""A one-turn env for the tests of TRL's asynchronous trainer on hf_rollouts envs (tests/test_trl_async.py and the
``async`` part of tests/vllm_training_worker.py): the reward is the share of the answer's characters that are vowels,
so nearly every group of a tiny random model has a spread and GRPO has something to learn. Named by import path in
task rows (``hfr_vowels.VowelShareEnv``, allowed with ``allowed_env_modules=("hfr_vowels",)``), as a user's env would
be."""

from __future__ import annotations

from typing import Any

from hf_rollouts.envs.base import MultistepEnv
from hf_rollouts.schema import to_task_dataset

ENV_PATH = "hfr_vowels.VowelShareEnv"
ALLOWED = ("hfr_vowels",)


class VowelShareEnv(MultistepEnv):
    default_max_turns = 1

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> dict[str, Any]:
        return {"task": task_data}

    def _format_prompt(self, state: dict[str, Any], step: int) -> str:
        return f"Say something ({state['task']['k']})."

    def _step_episode(self, session_id: str, state: dict[str, Any], action: str):
        return state, sum(c in "aeiouAEIOU" for c in action) / max(1, len(action)), True, {}

    def _calculate_reward(self, state: dict[str, Any], step_rewards: list[float]) -> float:
        return float(sum(step_rewards))


def vowel_tasks(n: int):
    """``n`` task rows of :class:`VowelShareEnv` (a task dataset)."""
    return to_task_dataset([{"env_class_path": ENV_PATH, "env_config": {}, "task_data": {"k": i}} for i in range(n)])
