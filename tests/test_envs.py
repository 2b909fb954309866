"""Per-environment behaviour (T1, T2, T5) and a check_env-style contract run over every registered env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_rollouts import ScriptedAgent
from hf_rollouts.envs import ENV_REGISTRY, get_env_class
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.envs.mastermind import MastermindEnv, score_guess
from hf_rollouts.envs.registry import class_path
from hf_rollouts.envs.twenty_questions import KnowledgeBase, TwentyQuestionsEnv
from hf_rollouts.schema import TASK_FEATURES

# -- contract checks over every registered environment ------------------------
MAKE_TASKS = sorted(set(ENV_REGISTRY) - {"dataset"})  # `dataset` plays the user's rows (tests/test_dataset_env.py)


@pytest.mark.parametrize("name", MAKE_TASKS)
def test_registered_env_contract(name, tokenizer):
    cls = get_env_class(name)
    env = cls(tokenizer, {"seed": 3, "max_turns": 2})
    train, eval_ = env.get_train_dataset(), env.get_eval_dataset()
    assert train.features == TASK_FEATURES and len(train) > 0 and len(eval_) > 0
    assert {r["env_class_path"] for r in train} == {class_path(cls)}
    train_tasks = {str(t) for t in map(json.loads, train["task_data"])}
    assert train_tasks.isdisjoint(str(t) for t in map(json.loads, eval_["task_data"]))  # disjoint splits
    again = cls(tokenizer, {"seed": 3, "max_turns": 2}).get_train_dataset()
    assert again["task_data"] == train["task_data"]  # deterministic under the seed
    other = cls(tokenizer, {"seed": 4, "max_turns": 2}).get_train_dataset()
    assert other["task_data"] != train["task_data"]
    assert len(env.get_train_dataset(num_tasks=3)) == 3
    # episode state lives in per-episode objects: two live episodes don't share anything
    s1 = env._initialize_episode("a", json.loads(train[0]["task_data"]))
    s2 = env._initialize_episode("b", json.loads(train[1]["task_data"]))
    assert s1 is not s2 and env._format_prompt(s1, 0)
    out = env.run_trial(train["task_data"][:2], ScriptedAgent(["hello"]), num_rollouts=2)
    assert len(out["statuses"]) == 4 and all(s in ("done", "truncated") for s in out["statuses"])


# -- stored env_class_path strings: datasets outlive code layouts ------------------------------------
STORED_ROWS = Path(__file__).parent / "fixtures" / "stored_task_rows"
"""Task rows saved by main ee0e73a, every path form they hold (tests/fixtures/stored_task_rows.md): registry names
(package.Class), get_train_dataset's (package.env.Class), and the old homes envs.games.* / envs.adapters.*."""
PACKAGES = ("twenty_questions", "mastermind", "guess_number", "hidden_function", "arithmetic", "dataset", "textarena",
            "reasoning_gym", "skyrl", "openenv", "verifiers")  # fmt: skip


def test_task_rows_saved_by_earlier_versions_still_load(tokenizer, tmp_path):
    import importlib
    import pathlib

    from datasets import load_from_disk

    import hf_rollouts
    from hf_rollouts.envs.registry import resolve_env_class, validate_tasks
    from hf_rollouts.pipeline import generate_rollouts

    stored = load_from_disk(str(STORED_ROWS), keep_in_memory=True)  # no cache file written into the fixture
    paths = sorted(set(stored["env_class_path"]))
    assert len(paths) == 46 and sum(".games." in p for p in paths) == 12 and sum(".adapters." in p for p in paths) == 10
    for path in paths:  # each form resolves to the one class at its public package, which rows store from now on
        cls = resolve_env_class(path)
        package = path.split(".")[3] if path.split(".")[2] in ("games", "adapters") else path.split(".")[2]
        assert cls.__module__ == f"hf_rollouts.envs.{package}.env" and cls.__name__ == path.rsplit(".", 1)[1]
        assert getattr(importlib.import_module(f"hf_rollouts.envs.{package}"), cls.__name__) is cls
        assert class_path(cls) == f"hf_rollouts.envs.{package}.env.{cls.__name__}"
    assert {p.split(".")[2] for p in paths} - {"games", "adapters"} == set(PACKAGES)
    root = pathlib.Path(hf_rollouts.__file__).parent / "envs"
    assert not (root / "games").exists() and not (root / "adapters").exists()  # the code is where its name says
    # the rows with a task play as they did (an adapter whose package is missing here is left out)
    playable = stored.filter(lambda r: r["task_data"] != {} and "verifiers" not in r["env_class_path"])
    assert len(playable) >= 30
    validate_tasks(playable)
    out = generate_rollouts(playable, ScriptedAgent(["3"]), 1, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    statuses = [s for row in out["statuses"] for s in row]
    assert len(statuses) == len(playable) and "error" not in statuses, out["errors"]
    with pytest.raises(ModuleNotFoundError):  # the stub modules went: an import of an old home fails plainly
        importlib.import_module("hf_rollouts.envs.games.mastermind")


def test_rows_store_public_paths_and_the_trust_rule_is_unchanged(tokenizer):
    from hf_rollouts.envs.registry import current_module, resolve_env_class
    from hf_rollouts.schema import TaskValidationError

    rows = MastermindEnv(tokenizer, {"max_turns": 2}).get_train_dataset(2)
    assert rows["env_class_path"] == ["hf_rollouts.envs.mastermind.env.MastermindEnv"] * 2
    assert current_module("hf_rollouts.envs.adapters.adapter") == "hf_rollouts.envs.adapter"
    assert current_module("hf_rollouts.envs.gamesx.y") == "hf_rollouts.envs.gamesx.y"
    assert current_module("mypkg.games.env") == "mypkg.games.env"
    with pytest.raises(TaskValidationError, match="outside the modules trusted"):  # the prefix rule, unchanged
        resolve_env_class("hf_rollouts_envs.mastermind.MastermindEnv")
    with pytest.raises(TaskValidationError, match="cannot import module"):
        resolve_env_class("hf_rollouts.envs.mastermind.nope.MastermindEnv")
    with pytest.raises(TaskValidationError, match="cannot import module 'hf_rollouts.envs.games.mastermind.nope'"):
        resolve_env_class("hf_rollouts.envs.games.mastermind.nope.MastermindEnv")  # named as the row names it


# -- Twenty Questions -----------------------------------------------------------
def test_twenty_questions_init_parses_config(tokenizer):
    env = TwentyQuestionsEnv(tokenizer, {"hardcore": True, "max_turns": 8, "question_reward": -0.01})
    assert env.tokenizer is tokenizer and env.env_config["hardcore"] is True
    assert env.hardcore and env.max_turns == 8 and env.question_reward == -0.01
    assert TwentyQuestionsEnv(tokenizer, {}).max_turns == 20
    with pytest.raises(ValueError, match="gamemaster"):
        TwentyQuestionsEnv(tokenizer, {"gamemaster": "gpt"})


def test_twenty_questions_dataset_rows(tokenizer):
    kb = KnowledgeBase.load()
    basic = TwentyQuestionsEnv(tokenizer, {}).get_train_dataset()
    hard = TwentyQuestionsEnv(tokenizer, {"hardcore": True}).get_eval_dataset()
    assert basic[0]["env_class_path"].endswith("TwentyQuestionsEnv") and json.loads(basic[0]["env_config"]) == {}
    assert all(set(t) == {"solution"} and t["solution"] in kb.basic for t in map(json.loads, basic["task_data"]))
    assert all(t["solution"] in kb.hardcore for t in map(json.loads, hard["task_data"]))


def test_twenty_questions_episode(tokenizer):
    env = TwentyQuestionsEnv(tokenizer, {"max_turns": 6, "question_reward": -0.1})
    agent = ScriptedAgent(["Is it alive?", "Is it an animal?", "Is it a dog?", "Is it a clock?"])
    ep = env._run_complete_episode("s", agent, {"solution": "clock"})
    answers = [m["content"] for m in ep["messages"] if m["role"] == "user"][1:]
    assert answers == ["No", "No", "No, it is not dog. Ask another question."]
    assert ep["status"] == "done" and ep["num_turns"] == 4
    assert ep["final_reward"] == pytest.approx(1.0 - 0.1 * 2)
    rewards = [r for r in ep["per_token_rewards"] if r != 0.0]
    assert rewards == pytest.approx([-0.1, -0.1, 1.0])  # one per rewarded turn, on agent tokens only
    assert all(ep["agent_token_mask"][i] for i, r in enumerate(ep["per_token_rewards"]) if r)


def test_twenty_questions_trial_with_the_real_model(tokenizer, hf_agent):
    """T5: a real env, the real tiny model, two tasks, two rollouts each."""
    env = TwentyQuestionsEnv(tokenizer, {"max_turns": 3})
    out = env.run_trial([{"solution": "clock"}, {"solution": "chair"}], hf_agent, num_rollouts=2)
    assert len(out["padded_full_token_ids"]) == 4
    for group in (slice(0, 2), slice(2, 4)):
        assert len({len(x) for x in out["padded_full_token_ids"][group]}) == 1
    assert all(s in ("done", "truncated") for s in out["statuses"]) and all(n >= 1 for n in out["num_turns"])


def test_custom_gamemaster_plugs_in(tokenizer):
    class AlwaysYes:
        def answer(self, question: str, solution: str) -> str:
            return "Yes"

    env = TwentyQuestionsEnv(tokenizer, {"max_turns": 2}, gamemaster=AlwaysYes())
    ep = env._run_complete_episode("s", ScriptedAgent(["Is it made of unobtainium?"]), {"solution": "clock"})
    assert ep["messages"][2]["content"] == "Yes"


def test_unknown_solution_is_an_error_with_a_fix(tokenizer):
    ep = TwentyQuestionsEnv(tokenizer, {})._run_complete_episode(
        "s", ScriptedAgent(["?"]), {"solution": "flux capacitor"}
    )
    assert ep["status"] == "error" and "KnowledgeBase.load().basic" in ep["error"]


# -- Mastermind ------------------------------------------------------------------
@pytest.mark.parametrize(
    "code, guess, pegs",
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], (4, 0)),
        ([1, 2, 3, 4], [4, 3, 2, 1], (0, 4)),
        ([1, 1, 2, 2], [1, 2, 1, 3], (1, 2)),
        ([6, 6, 6, 6], [1, 2, 3, 4], (0, 0)),
    ],
)
def test_mastermind_pegs(code, guess, pegs):
    assert score_guess(code, guess) == pegs


def test_mastermind_bad_guess_costs_a_turn_with_a_clear_message(tokenizer):
    env = MastermindEnv(tokenizer, {"max_guesses": 3, "invalid_penalty": 0.5})
    ep = env._run_complete_episode("s", ScriptedAgent(["banana", "1 2 7 4", "1 2 3 4"]), {"code": [1, 2, 3, 4]})
    msgs = [m["content"] for m in ep["messages"] if m["role"] == "user"]
    assert msgs[1].startswith("Invalid guess. Give exactly 4 digits, each from 1 to 6")
    assert ep["num_turns"] == 3 and ep["status"] == "done" and ep["final_reward"] == pytest.approx(1.0 - 0.5 - 0.5)


def test_guess_number_hints(tokenizer):
    env = GuessNumberEnv(tokenizer, {"max_turns": 3})
    ep = env._run_complete_episode("s", ScriptedAgent(["5", "8", "7"]), {"target": 7})
    assert [m["content"] for m in ep["messages"] if m["role"] == "user"][1:] == ["Higher.", "Lower."]
    assert ep["status"] == "done" and ep["final_reward"] == 1.0
