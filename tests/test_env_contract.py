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
    [
        ({"flag": 1}, "must be a bool"),
        ({"flag": "yes"}, "must be a bool"),
        ({"flag_early": True}, "with done=False at turn 1"),
        ({"flag_early": True, "max_turns": 2}, "with done=False at turn 1"),  # on our last turn too
    ],
)
def test_bad_truncated_flags_are_errors_never_rewards(tokenizer, config, message):
    env = OwnLimitEnv(tokenizer, {"own_limit": 3, **config})
    ep = env._run_complete_episode("s", ScriptedAgent(["no"] * 4), {})
    assert ep["status"] == "error" and message in ep["error"] and math.isnan(ep["final_reward"])


def test_check_env_catches_a_truncated_flag_without_done(tokenizer):
    check_env(OwnLimitEnv, tokenizer, env_config={"own_limit": 2})
    with pytest.raises(EnvCheckError, match="True only together with done=True"):
        check_env(OwnLimitEnv, tokenizer, env_config={"own_limit": 3, "flag_early": True})


# -- group rewards ------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class GroupConfig(EnvConfig):
    mode: str = option("center", "What the group hook does.", choices=("center", "raise", "nan", "short", "async"))


class GroupEnv(MultistepEnv):
    """Two turns; step reward 1 for each 'good' action. The group hook centres the group's final rewards."""

    config_class = GroupConfig
    default_max_turns = 2

    def _initialize_episode(self, session_id, task_data):
        return {"actions": []}

    def _format_prompt(self, state, step):
        return "say good"

    def _step_episode(self, session_id, state, action):
        state = {"actions": [*state["actions"], action]}
        return state, float(action == "good"), len(state["actions"]) == 2, {}

    def _calculate_group_rewards(self, task_data, states, final_rewards):
        assert all(len(s["actions"]) == 2 for s in states)  # the final states
        mode = self.config.mode
        if mode == "raise":
            raise RuntimeError("judge unavailable")
        if mode == "nan":
            return [math.nan] * len(states)
        if mode == "short":
            return final_rewards[:-1]
        mean = sum(final_rewards) / len(final_rewards)
        centred = [r - mean for r in final_rewards]
        if mode == "async":

            async def later():
                return centred

            return later()
        return centred


class PerRollout(ScriptedAgent):
    def act_batch(self, requests):
        return [self._answer(r) for r in requests]

    def _answer(self, request):
        k = int(request.session_id.rsplit("rollout", 1)[1])
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        from hf_rollouts.types import Action

        return Action(text="good" if turn < k else "bad"), None


@pytest.mark.parametrize("placement", ["last", "spread"])
@pytest.mark.parametrize("mode", ["center", "async"])
def test_group_rewards_replace_final_rewards_and_land_on_the_last_turn(tokenizer, placement, mode):
    env = GroupEnv(tokenizer, {"reward_placement": placement, "mode": mode})
    out = env.run_trial([{}], PerRollout(["x"]), num_rollouts=3)
    assert out["statuses"] == ["done"] * 3
    assert out["final_rewards"] == pytest.approx([-1.0, 0.0, 1.0])  # step sums 0, 1, 2 centred
    for k in range(3):
        rewards, mask = out["padded_per_token_rewards"][k], out["padded_agent_token_mask"][k]
        assert sum(rewards) == pytest.approx(out["final_rewards"][k])  # the reward rule still holds
        assert all(m or r == 0.0 for m, r in zip(mask, rewards))


def test_group_rewards_through_the_pipeline(tokenizer, tmp_path):
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.schema import to_task_dataset

    path = f"{GroupEnv.__module__}.GroupEnv"
    tasks = to_task_dataset([{"env_class_path": path, "env_config": {}, "task_data": {"i": i}} for i in range(2)])
    agent = PerRollout(["x"])
    agent.tokenizer = tokenizer
    out = generate_rollouts(tasks, agent, 3, cache_dir=tmp_path, progress=False, allowed_env_modules=[__name__])
    assert out["final_rewards"] == [pytest.approx([-1.0, 0.0, 1.0])] * 2
    assert "env_state" not in out.column_names


def test_errored_rollouts_are_left_out_of_the_group(tokenizer):
    env = GroupEnv(tokenizer, {})
    seen = []
    original = env._calculate_group_rewards
    env._calculate_group_rewards = lambda t, states, finals: seen.append(len(states)) or original(t, states, finals)
    out = env.run_trial([{}], ScriptedAgent(["good"], fail_at=[0]), num_rollouts=3)
    assert sorted(out["statuses"]) == ["done", "done", "error"] and seen == [2]
    assert [r for r in out["final_rewards"] if not math.isnan(r)] == [0.0, 0.0]


@pytest.mark.parametrize("mode, message", [("raise", "judge unavailable"), ("nan", "finite"), ("short", "one final")])
def test_a_failing_group_hook_makes_the_group_error(tokenizer, mode, message):
    env = GroupEnv(tokenizer, {"mode": mode})
    out = env.run_trial([{}], ScriptedAgent(["good"]), num_rollouts=2)
    assert out["statuses"] == ["error", "error"] and all(math.isnan(r) for r in out["final_rewards"])
    assert all(message in e and "_calculate_group_rewards" in e for e in out["errors"])
    with pytest.raises(Exception, match=message):
        env.run_trial([{}], ScriptedAgent(["good"]), num_rollouts=2, on_error="raise")


def test_envs_without_a_group_hook_are_unchanged(tokenizer):
    env = OwnLimitEnv(tokenizer, {})
    out = env.run_trial([{}], ScriptedAgent(["no", "win"]), num_rollouts=2)
    assert out["final_rewards"] == [1.0, 1.0] and out["statuses"] == ["done", "done"]
