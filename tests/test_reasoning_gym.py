"""reasoning-gym adapter: recipes regenerated per episode, score_answer rewards, multi-attempt feedback."""

from __future__ import annotations

import json
import math
import re

import pytest

pytest.importorskip("reasoning_gym")

from hf_rollouts import ScriptedAgent  # noqa: E402
from hf_rollouts.envs.check import check_env  # noqa: E402
from hf_rollouts.envs.reasoning_gym import ReasoningGymEnv  # noqa: E402
from hf_rollouts.pipeline import generate_rollouts  # noqa: E402


def arithmetic_solver(messages):
    """Reads the question ("Calculate 478 / 1 + -682.") and answers it: a scripted agent that solves the task."""
    question = next(m["content"] for m in messages if m["role"] == "user")
    expression = re.search(r"Calculate (.*?)\.?$", question.strip().splitlines()[0]).group(1)
    value = eval(expression, {"__builtins__": {}})  # noqa: S307 - digits and operators only
    value = int(value) if float(value).is_integer() else round(value, 2)
    return f"The result is <answer>{value}</answer>"


CONFIG = {"dataset": "basic_arithmetic", "dataset_config": {"max_terms": 3, "max_digits": 2}}


def test_check_env_single_and_multi_attempt(tokenizer):
    assert check_env(ReasoningGymEnv, tokenizer, env_config=CONFIG).steps > 0
    report = check_env(ReasoningGymEnv, tokenizer, env_config={**CONFIG, "max_attempts": 3})
    assert report.steps == 3 * 3  # DEFAULT_ACTIONS never answer: every attempt is used


def test_tasks_are_recipes_with_disjoint_seeds(tokenizer):
    env = ReasoningGymEnv(tokenizer, CONFIG)
    train, evaluation = env.get_train_dataset(5), env.get_eval_dataset(3)
    assert json.loads(train[0]["task_data"]) == {
        "seed": json.loads(train[0]["task_data"])["seed"],
        "size": 5,
        "index": 0,
    }
    (ts,) = {t["seed"] for t in map(json.loads, train["task_data"])}
    (es,) = {t["seed"] for t in map(json.loads, evaluation["task_data"])}
    assert abs(ts - es) >= 2**30 - 5  # Random(seed + index) ranges never meet
    assert ReasoningGymEnv(tokenizer, CONFIG).get_train_dataset(5)["task_data"] == train["task_data"]
    assert env.fingerprint()["reasoning-gym"] == "0.1.25"


def test_scripted_solver_gets_full_reward_through_the_pipeline(tokenizer, tmp_path):
    env = ReasoningGymEnv(tokenizer, CONFIG)
    tasks = env.get_train_dataset(6)
    agent = ScriptedAgent(arithmetic_solver)
    agent.tokenizer = tokenizer
    out = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path, progress=False)
    statuses = [s for row in out["statuses"] for s in row]
    rewards = [r for row in out["final_rewards"] for r in row]
    assert statuses == ["done"] * 12 and rewards == [1.0] * 12
    row = out[0]
    assert row["conversations"][0][0]["role"] == "system"  # reasoning-gym's default system prompt
    assert "<answer>" in row["conversations"][0][0]["content"]


def test_entry_is_regenerated_so_structured_answers_still_score(tokenizer):
    """arc_agi scores its own answer 1.0 only on the regenerated entry (a JSON round trip gives 0.05)."""
    import reasoning_gym

    env = ReasoningGymEnv(tokenizer, {"dataset": "arc_agi"})
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    entry = reasoning_gym.create_dataset("arc_agi", seed=task["seed"], size=task["size"])[task["index"]]
    ep = env._run_complete_episode("s", ScriptedAgent([f"<answer>{entry['answer']}</answer>"]), task)
    assert ep["status"] == "done" and ep["final_reward"] == 1.0


@pytest.mark.parametrize(
    "dataset, dataset_config, shown",
    [
        ("composite", {"datasets": [{"name": "leg_counting", "weight": 1.0, "config": {"max_animals": 3}}]}, "legs"),
        ("arc_agi", {"board_format_opts": {"col_delimiter": ","}}, ","),
        ("rearc", {"board_format_opts": {"col_delimiter": ","}}, ","),
        (
            "composite",
            {"datasets": [{"name": "arc_agi", "weight": 1.0, "config": {"board_format_opts": {"col_delimiter": ","}}}]},
            ",",
        ),  # fmt: skip
    ],
)
def test_nested_configs_are_built_as_reasoning_gym_builds_them(dataset, dataset_config, shown, tokenizer):
    """Config fields that are dataclasses (composite's DatasetSpecs, ARC's BoardFormattingOptions) arrive as JSON
    dicts; they are built into those classes (as composite's from_yaml does), and the right answer scores 1.0."""
    env = ReasoningGymEnv(tokenizer, {"dataset": dataset, "dataset_config": dataset_config})
    task = json.loads(env.get_train_dataset(2)[1]["task_data"])
    entry = env.dataset_of(task)[task["index"]]
    assert shown in entry["question"]
    ep = env._run_complete_episode("s", ScriptedAgent([f"<answer>{entry['answer']}</answer>"]), task)
    assert ep["status"] == "done" and ep["final_reward"] == 1.0, ep["error"]


def test_multi_attempt_feedback_then_success(tokenizer):
    env = ReasoningGymEnv(tokenizer, {**CONFIG, "max_attempts": 3})
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    script = iter(["I do not know", "<answer>-999999</answer>"])
    agent = ScriptedAgent(lambda messages: next(script, None) or arithmetic_solver(messages))
    ep = env._run_complete_episode("s", agent, task)
    assert ep["status"] == "done" and ep["num_turns"] == 3 and ep["final_reward"] == 1.0
    users = [m["content"] for m in ep["messages"] if m["role"] == "user"]
    assert users[1].startswith("No answer found") and "Attempts left: 2" in users[1]
    assert users[2].startswith("That answer is not correct") and "Attempts left: 1" in users[2]
    assert [t.reward for t in ep["turns"]] == [0.0, 0.0, 1.0]
    lost = env._run_complete_episode("s", ScriptedAgent(["<answer>-999999</answer>"]), task)
    assert lost["status"] == "done" and lost["num_turns"] == 3 and lost["final_reward"] == 0.0


def test_recipe_without_seed_and_library_failures_are_errors(tokenizer, monkeypatch):
    env = ReasoningGymEnv(tokenizer, CONFIG)
    ep = env._run_complete_episode("s", ScriptedAgent(["<answer>1</answer>"]), {"size": 3, "index": 0})
    assert ep["status"] == "error" and "explicit seed" in ep["error"] and math.isnan(ep["final_reward"])
    task = json.loads(env.get_train_dataset(1)[0]["task_data"])
    dataset = env.dataset_of(task)

    def broken(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(dataset, "score_answer", broken)
    ep = env._run_complete_episode("s", ScriptedAgent(["<answer>1</answer>"]), task)
    assert ep["status"] == "error" and "KeyError" in ep["error"] and math.isnan(ep["final_reward"])


def test_bad_names_and_configs_fail_at_construction(tokenizer):
    with pytest.raises(ValueError, match="basic_arithmetic"):
        ReasoningGymEnv(tokenizer, {"dataset": "basic_arithmetics"})
    with pytest.raises(ValueError, match="cannot be built"):
        ReasoningGymEnv(tokenizer, {"dataset": "basic_arithmetic", "dataset_config": {"no_such_key": 1}})
    with pytest.raises(ValueError, match="seed or size"):
        ReasoningGymEnv(tokenizer, {"dataset": "basic_arithmetic", "dataset_config": {"seed": 1}})


def test_tiny_model_plays_real_episodes(tiny, tmp_path):
    from hf_rollouts.agents.hf import TransformersAgent

    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=12, seed=0)
    tasks = ReasoningGymEnv(tok, {**CONFIG, "max_attempts": 2}).get_train_dataset(3)
    out = generate_rollouts(tasks, agent, 2, cache_dir=tmp_path, progress=False)
    statuses = [s for row in out["statuses"] for s in row]
    assert set(statuses) <= {"done", "truncated"} and len(statuses) == 6
    assert all(math.isfinite(r) and 0.0 <= r <= 1.0 for row in out["final_rewards"] for r in row)


def test_cli_short_name(tmp_path):
    from datasets import load_from_disk

    from hf_rollouts.cli import main

    out = tmp_path / "t"
    assert main(["tasks", "--env", "reasoning_gym:basic_arithmetic", "--num-tasks", "3", "--output", str(out)]) == 0
    ds = load_from_disk(str(out))
    assert ds[0]["env_class_path"] == "hf_rollouts.envs.reasoning_gym.env.ReasoningGymEnv"
    assert json.loads(ds[0]["env_config"]) == {"dataset": "basic_arithmetic"} and len(ds) == 3
