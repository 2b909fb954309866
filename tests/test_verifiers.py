"""verifiers adapter (classic API, verifiers 0.3.x) with a small env package (tests/hfr_vf_arith.py)."""

from __future__ import annotations

import math
import re

import pytest

pytest.importorskip("verifiers.legacy")

from hf_rollouts import ScriptedAgent  # noqa: E402
from hf_rollouts.envs.check import check_env  # noqa: E402
from hf_rollouts.envs.verifiers import VerifiersEnv  # noqa: E402
from hf_rollouts.pipeline import generate_rollouts  # noqa: E402
from hf_rollouts.schema import TaskValidationError  # noqa: E402

ALLOW = ["hfr_vf_arith"]


def adder(messages):
    a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
    return f"The sum is {a + b}"


def bisect_solver(messages):
    low, high = 1, 15
    for guess, hint in zip(messages[1::2], messages[2::2]):
        g = int(guess["content"])
        low, high = (g + 1, high) if hint["content"].startswith("Higher") else (low, g - 1)
    return str((low + high) // 2)


def scripted(fn, tokenizer):
    agent = ScriptedAgent(fn)
    agent.tokenizer = tokenizer
    return agent


def flat(out, column):
    return [x for row in out[column] for x in row]


def test_single_turn_scripted_solver_and_tiny_model(tokenizer, tiny, tmp_path):
    from hf_rollouts.agents.hf import TransformersAgent

    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"})
    tasks = env.get_train_dataset(4)
    assert tasks[0]["task_data"]["answer"] and tasks[0]["task_data"]["prompt"][0]["role"] == "user"
    out = generate_rollouts(tasks, scripted(adder, tokenizer), 2, cache_dir=tmp_path / "a", progress=False,
                            allowed_env_modules=ALLOW)  # fmt: skip
    assert flat(out, "statuses") == ["done"] * 8 and flat(out, "final_rewards") == [1.0] * 8
    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=8, seed=0)
    out = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path / "b", progress=False, allowed_env_modules=ALLOW)
    assert set(flat(out, "statuses")) <= {"done", "truncated"} and set(flat(out, "final_rewards")) <= {0.0, 1.0}


def test_multi_turn_env_response_and_its_own_turn_limit(tokenizer):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "multi"}})
    assert env.max_turns == 5  # the env's own
    task = env.get_train_dataset(1)[0]["task_data"]
    won = env._run_complete_episode("s", ScriptedAgent(bisect_solver), task)
    assert won["status"] == "done" and won["final_reward"] == 1.0 and won["num_turns"] <= 4
    assert {m["content"] for m in won["messages"][2::2]} <= {"Higher.", "Lower."}
    lost = env._run_complete_episode("s", ScriptedAgent(["0"]), task)
    assert lost["status"] == "truncated" and lost["num_turns"] == 5 and lost["final_reward"] == 0.0
    assert lost["turns"][-1].info["stop_condition"] == "max_turns_reached"


def test_group_rubric_scores_the_whole_group(tokenizer, tmp_path):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "group"}})
    assert env.group_scored
    tasks = env.get_train_dataset(2)

    answers = iter(["{}", "Well, the sum is {}", "wrong"] * 2)

    def solver(messages):
        a, b = map(int, re.findall(r"\d+", messages[-1]["content"])[:2])
        return next(answers).format(a + b)

    out = env.run_trial(list(tasks["task_data"]), scripted(solver, tokenizer), num_rollouts=3, max_concurrency=1)
    assert out["statuses"] == ["done"] * 6
    assert out["final_rewards"] == [1.5, 1.0, 0.0, 1.5, 1.0, 0.0]  # exact + the group's shortest-correct bonus
    for k in range(6):
        assert sum(out["padded_per_token_rewards"][k]) == pytest.approx(out["final_rewards"][k])


def test_reward_function_errors_are_episode_errors(tokenizer):
    env = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith", "env_args": {"kind": "broken"}})
    task = env.get_train_dataset(1)[0]["task_data"]
    ep = env._run_complete_episode("s", ScriptedAgent(adder), task)
    assert ep["status"] == "error" and "reward function 'broken' raised KeyError" in ep["error"]
    assert math.isnan(ep["final_reward"])


def test_check_env_and_trust(tokenizer, tmp_path):
    assert check_env(VerifiersEnv, tokenizer, env_config={"env_id": "hfr-vf-arith"}, actions=["42"]).steps > 0
    tasks = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"}).get_train_dataset(1)
    with pytest.raises(TaskValidationError, match="names code to import: module 'hfr_vf_arith'"):
        generate_rollouts(tasks, scripted(adder, tokenizer), 1, cache_dir=tmp_path, progress=False)
    fp = VerifiersEnv(tokenizer, {"env_id": "hfr-vf-arith"}).fingerprint()
    assert fp["verifiers"].startswith("0.3") and fp["env_module"] == "hfr_vf_arith"
