"""Env-contract extensions for external environments: truncation reported by the env (info["truncated"])."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from hf_rollouts import MultistepEnv, ScriptedAgent
from hf_rollouts.envs.check import EnvCheckError, check_env
from hf_rollouts.envs.config import EnvConfig, option


@dataclass(frozen=True, kw_only=True)
class LimitConfig(EnvConfig):
    own_limit: int = option(2, "The env's own turn limit.", ge=1)
    flag: object = option(True, "What info['truncated'] says at the limit (tests give non-bools).")
    flag_early: bool = option(False, "Say truncated one step before ending (a contract violation).")


class OwnLimitEnv(MultistepEnv):
    """Says 'win' wins; ends the episode itself after own_limit turns, reporting truncation."""

    config_class = LimitConfig
    default_max_turns = 10

    def _initialize_episode(self, session_id, task_data):
        return {"turn": 0}

    def _format_prompt(self, state, step):
        return f"turn {state['turn']}: say win"

    def _step_episode(self, session_id, state, action):
        state = {"turn": state["turn"] + 1}
        if action == "win":
            return state, 1.0, True, {}
        limit = state["turn"] >= self.config.own_limit
        if self.config.flag_early and state["turn"] == self.config.own_limit - 1:
            return state, 0.0, False, {"truncated": True}
        return state, -0.5 if limit else 0.0, limit, {"truncated": self.config.flag} if limit else {}

    def _task_list(self, split, num_tasks):
        return [{"i": i, "split": split} for i in range(num_tasks or 2)]


def test_env_reported_truncation_is_stored_as_truncated(tokenizer):
    env = OwnLimitEnv(tokenizer, {"own_limit": 2})
    ep = env._run_complete_episode("s", ScriptedAgent(["no", "no", "no"]), {})
    assert ep["status"] == "truncated" and ep["num_turns"] == 2 and ep["error"] is None
    assert ep["final_reward"] == -0.5 and sum(ep["per_token_rewards"]) == -0.5  # the env's reward is kept
    assert ep["turns"][-1].info["truncated"] is True
    won = env._run_complete_episode("s", ScriptedAgent(["no", "win"]), {})
    assert won["status"] == "done" and won["final_reward"] == 1.0


def test_truncated_flag_false_keeps_done(tokenizer):
    env = OwnLimitEnv(tokenizer, {"own_limit": 1, "flag": False})
    assert env._run_complete_episode("s", ScriptedAgent(["no"]), {})["status"] == "done"


@pytest.mark.parametrize(
    "config, message",
    [({"flag": 1}, "must be a bool"), ({"flag": "yes"}, "must be a bool"), ({"flag_early": True}, "went on")],
)
def test_bad_truncated_flags_are_errors_never_rewards(tokenizer, config, message):
    env = OwnLimitEnv(tokenizer, {"own_limit": 3, **config})
    ep = env._run_complete_episode("s", ScriptedAgent(["no"] * 4), {})
    assert ep["status"] == "error" and message in ep["error"] and math.isnan(ep["final_reward"])


def test_check_env_catches_a_truncated_flag_without_done(tokenizer):
    check_env(OwnLimitEnv, tokenizer, env_config={"own_limit": 2})
    with pytest.raises(EnvCheckError, match="True only together with done=True"):
        check_env(OwnLimitEnv, tokenizer, env_config={"own_limit": 3, "flag_early": True})
