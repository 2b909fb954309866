"""compute_stats over the Arrow columns gives the numbers the row-by-row statistics gave (the reference kept in
scripts/benchmark_scale.py), on generated datasets (tools, several envs, a selection) and on edge cases (error
episodes, rollouts without a verdict, datasets written before the solved column existed, an empty dataset)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from datasets import Dataset, concatenate_datasets

from hf_rollouts import generate_rollouts
from hf_rollouts.agents import SamplingConfig, ScriptedAgent, load_agent
from hf_rollouts.envs import get_env_class
from hf_rollouts.publish import compute_stats

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("benchmark_scale", ROOT / "scripts" / "benchmark_scale.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def assert_same(ds):
    new, old = compute_stats(ds), bench.rowwise_stats(ds)
    assert bench.same_stats(new, old), (new.as_dict(), old.as_dict())
    return new


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Two envs (a game and a tool env), with turns cut by the token budget and tool calls of several statuses."""
    agent = load_agent("tiny", SamplingConfig(max_new_tokens=5))
    cache = tmp_path_factory.mktemp("stats")
    games = get_env_class("guess_number")(agent.tokenizer, {"max_turns": 3}).get_train_dataset(3)
    calc = get_env_class("calculator")(agent.tokenizer, {}).get_train_dataset(3)
    ds = generate_rollouts(concatenate_datasets([games, calc]), agent, 3, cache_dir=cache, progress=False)
    scripted = ScriptedAgent(['<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "3"])
    tools = generate_rollouts(calc, scripted, 2, tokenizer=agent.tokenizer, cache_dir=cache, progress=False)
    return ds, tools


def test_generated_datasets_give_the_same_numbers(mixed):
    ds, tools = mixed
    stats = assert_same(ds)
    assert stats.rollouts == 18 and set(stats.environments) == {"GuessNumberEnv", "CalculatorEnv"}
    assert stats.mean_tokens > stats.mean_agent_tokens > 0
    with_tools = assert_same(tools)
    assert with_tools.tool_calls and with_tools.tool_statuses and not math.isnan(with_tools.mean_tool_seconds)
    assert_same(ds.select([5, 0, 2]))  # an indices mapping: rows read through it, in its order
    assert_same(ds.filter(lambda r: r["env_class_path"].endswith("GuessNumberEnv")))


def test_errors_no_verdicts_and_old_datasets(mixed):
    ds, _ = mixed

    def mutate(row, i):
        n = len(row["final_rewards"])
        statuses = ["error" if (i + r) % 3 == 0 else s for r, s in enumerate(row["statuses"])]
        rewards = [math.nan if s == "error" else x for s, x in zip(statuses, row["final_rewards"])]
        solved = [None if (i + r) % 2 else (r == 0) for r in range(n)] if i != 1 else [None] * n
        return {"statuses": statuses, "final_rewards": rewards, "solved": solved}

    edited = ds.map(mutate, with_indices=True, features=ds.features)
    stats = assert_same(edited)
    assert stats.errors and stats.judged < stats.rollouts and not math.isnan(stats.pass_at_k)
    assert_same(ds.remove_columns(["solved", "num_cut_turns", "num_tool_calls", "num_tool_errors", "tool_calls"]))
    none = ds.map(lambda r: {"solved": [None] * len(r["solved"])}, features=ds.features)
    assert math.isnan(assert_same(none).pass_at_k)
    assert_same(ds.select([]))


def test_the_check_can_fail(mixed):
    """The comparison is not vacuous: one more agent token changes the mean the reference and the new code give."""
    ds, _ = mixed
    before = compute_stats(ds).mean_agent_tokens
    bumped = ds.map(
        lambda r, i: {"padded_agent_token_mask": [[1] * len(m) for m in r["padded_agent_token_mask"]] if i == 0 else
                      r["padded_agent_token_mask"]}, with_indices=True, features=ds.features,
    )  # fmt: skip
    assert assert_same(bumped).mean_agent_tokens > before
    assert not bench.same_stats(compute_stats(bumped), compute_stats(ds))


def test_an_empty_tool_record_list_and_a_dataset_from_rows():
    rows = Dataset.from_dict({"env_class_path": ["a.B"], "final_rewards": [[1.0, 0.0]], "statuses": [["done", "done"]],
                              "num_turns": [[1, 2]], "padded_full_attention_mask": [[[1, 1, 0], [1, 1, 1]]],
                              "padded_agent_token_mask": [[[0, 1, 0], [0, 1, 1]]]})  # fmt: skip
    stats = assert_same(rows)
    assert (stats.mean_tokens, stats.mean_agent_tokens, stats.judged) == (2.5, 1.5, 0)
