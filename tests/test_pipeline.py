"""generate_rollouts: schema, per-task padding, caching, fresh seeds, resume, save/load, bad input."""

from __future__ import annotations

import math

import pytest
from datasets import Value, concatenate_datasets, load_dataset, load_from_disk

from hf_rollouts import ScriptedAgent
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import parquet_files, save_rollouts
from hf_rollouts.schema import ROLLOUT_FEATURES, TaskValidationError, to_task_dataset


@pytest.fixture()
def tasks(tokenizer):
    a = MastermindEnv(tokenizer, {"max_turns": 3}).get_train_dataset(3)
    b = GuessNumberEnv(tokenizer, {"max_turns": 2, "high": 4}).get_train_dataset(3)
    return concatenate_datasets([a, b])


def run(tasks, agent, tokenizer, tmp_path, **kw):
    kw.setdefault("num_rollouts", 2)
    kw.setdefault("batch_size", 2)
    kw.setdefault("shard_size", 2)
    return generate_rollouts(tasks, agent, tokenizer=tokenizer, cache_dir=tmp_path / "cache", progress=False, **kw)


def test_output_schema_and_per_task_padding(tasks, hf_agent, tmp_path):
    ds = run(tasks, hf_agent, None, tmp_path, num_rollouts=3)
    assert len(ds) == len(tasks)
    assert ds.column_names[:3] == ["env_class_path", "env_config", "task_data"]
    assert ds.select_columns(ds.column_names[:3]).to_list() == tasks.to_list()  # task columns kept, exactly
    for name, feature in ROLLOUT_FEATURES.items():
        assert ds.features[name] == feature
    assert ds.features["padded_full_token_ids"].feature.feature == Value("int32")
    assert ds.features["padded_agent_token_mask"].feature.feature == Value("int8")
    widths = set()
    for row in ds:
        assert len(row["final_rewards"]) == len(row["statuses"]) == 3
        keys = [
            "padded_full_token_ids",
            "padded_full_attention_mask",
            "padded_agent_token_mask",
            "padded_per_token_rewards",
            "padded_logprobs",
        ]
        row_widths = {len(seq) for k in keys for seq in row[k]}
        assert len(row_widths) == 1
        widths |= row_widths
        for ids, att, mask, rew in zip(*(row[k] for k in keys[:4])):
            n = sum(att)
            assert att == [1] * n + [0] * (len(att) - n)
            assert ids[n:] == [hf_agent.tokenizer.pad_token_id] * (len(ids) - n)
            assert all(r == 0.0 or m == 1 for r, m in zip(rew, mask))
    assert len(widths) > 1  # tasks differ in length


def test_same_call_is_cached_and_new_seed_samples_afresh(tasks, hf_agent, tmp_path):
    first = run(tasks, hf_agent, None, tmp_path, seed=0)
    cached = run(tasks, hf_agent, None, tmp_path, seed=0)
    assert cached.cache_files and all("shard" in f["filename"] for f in cached.cache_files)
    assert cached["padded_full_token_ids"] == first["padded_full_token_ids"]
    calls_before = hf_agent.generate_calls
    run(tasks, hf_agent, None, tmp_path, seed=0)
    assert hf_agent.generate_calls == calls_before  # served from cache: no generation at all
    fresh = run(tasks, hf_agent, None, tmp_path, seed=1)
    assert hf_agent.generate_calls > calls_before
    assert fresh["padded_full_token_ids"] != first["padded_full_token_ids"]


def test_sampling_is_reproducible_without_cache(tasks, hf_agent, tmp_path):
    a = run(tasks, hf_agent, None, tmp_path / "a", seed=7)
    b = run(tasks, hf_agent, None, tmp_path / "b", seed=7)
    assert a["padded_full_token_ids"] == b["padded_full_token_ids"]
    assert a["padded_logprobs"] == b["padded_logprobs"]


class Interrupt(ScriptedAgent):
    """Dies (like a killed job) after `after` calls; otherwise indistinguishable from ScriptedAgent."""

    def __init__(self, responses, after):
        super().__init__(responses)
        self.after = after

    def get_action(self, messages, agent_state=None):
        if self.calls >= self.after:
            raise KeyboardInterrupt
        return super().get_action(messages, agent_state)

    def fingerprint(self):
        return ScriptedAgent(self.responses).fingerprint()  # the same run, as far as the cache can tell


def test_resume_after_interruption_redoes_only_unfinished_shards(tasks, tokenizer, tmp_path):
    script = ["1 2 3 4", "2"]
    reference = ScriptedAgent(script)
    full = run(tasks, reference, tokenizer, tmp_path / "reference")
    per_shard_calls = ScriptedAgent(script)
    run(tasks.select(range(2)), per_shard_calls, tokenizer, tmp_path / "probe")
    with pytest.raises(KeyboardInterrupt):
        run(tasks, Interrupt(script, after=per_shard_calls.calls + 1), tokenizer, tmp_path)
    done = sorted((tmp_path / "cache").glob("*-shard*.arrow"))
    assert len(done) == 1  # shard 0 finished before the kill, shard 1 did not
    resumed_agent = ScriptedAgent(script)
    resumed = run(tasks, resumed_agent, tokenizer, tmp_path)
    assert resumed.to_list() == full.to_list()
    assert resumed_agent.calls == reference.calls - per_shard_calls.calls  # shard 0 was not replayed


def test_save_and_load_round_trip(tasks, hf_agent, tmp_path):
    ds = run(tasks, hf_agent, None, tmp_path)
    out = save_rollouts(ds, tmp_path / "out")
    expected = ds.to_list()
    assert load_from_disk(str(out)).to_list() == expected
    from_parquet = load_dataset("parquet", data_files=parquet_files(out), split="train")
    assert from_parquet.features == ds.features
    got = from_parquet.to_list()
    assert [r["padded_full_token_ids"] for r in got] == [r["padded_full_token_ids"] for r in expected]
    assert [r["task_data"] for r in got] == [r["task_data"] for r in expected]


def test_failed_episodes_are_kept_as_errors(tasks, tokenizer, tmp_path):
    ds = run(
        tasks.select(range(2)),
        ScriptedAgent(["1 2 3 4"], fail_at={0}),
        tokenizer,
        tmp_path,
        batch_size=1,
        max_concurrency=1,
    )
    statuses = [s for row in ds["statuses"] for s in row]
    rewards = [r for row in ds["final_rewards"] for r in row]
    errors = [e for row in ds["errors"] for e in row]
    assert statuses.count("error") == 1 and len(statuses) == 4
    i = statuses.index("error")
    assert math.isnan(rewards[i]) and "scripted failure" in errors[i]
    assert all(e is None for j, e in enumerate(errors) if j != i)


def test_bad_input_fails_before_any_generation(tokenizer, tmp_path):
    agent = ScriptedAgent(["1 2 3 4"])
    good = {
        "env_class_path": "hf_rollouts.envs.mastermind.MastermindEnv",
        "env_config": {},
        "task_data": {"code": [1, 1, 1, 1]},
    }
    bad_config = {**good, "env_config": {"code_length": 0}}
    with pytest.raises(ValueError, match=r"row 1, field 'env_config'"):
        run(to_task_dataset([good, bad_config]), agent, tokenizer, tmp_path)
    with pytest.raises(TaskValidationError, match=r"row 1: field 'task_data'"):
        run(to_task_dataset([good, {**good, "task_data": [1]}]), agent, tokenizer, tmp_path)
    with pytest.raises(ValueError, match="tokenizer="):
        generate_rollouts(to_task_dataset([good]), agent, 1)
    assert agent.calls == 0


def test_cache_key_covers_agents_that_cannot_describe_themselves(tasks, tokenizer, tmp_path):
    from hf_rollouts.agents.base import Agent

    class Fixed(Agent):  # no fingerprint override: its behaviour is unknown to the cache
        def __init__(self, answer):
            self.answer = answer

        def get_action(self, messages, agent_state=None):
            return self.answer, None

    three = run(tasks.select(range(1)), Fixed("3 3 3 3"), tokenizer, tmp_path)
    seven = run(tasks.select(range(1)), Fixed("1 1 1 1"), tokenizer, tmp_path)
    assert three["conversations"][0][0][1]["content"] == "3 3 3 3"
    assert seven["conversations"][0][0][1]["content"] == "1 1 1 1"  # not the first agent's cached samples
    lam = run(tasks.select(range(1)), ScriptedAgent(lambda m: "2 2 2 2"), tokenizer, tmp_path)
    assert lam["conversations"][0][0][1]["content"] == "2 2 2 2"


def test_cache_key_covers_the_env_implementation(tasks, tokenizer, tmp_path, monkeypatch):
    from hf_rollouts.envs.registry import validate_tasks
    from hf_rollouts.pipeline import EnvCache, RolloutOptions, rollout_fingerprint

    agent, opts = ScriptedAgent(["1"]), RolloutOptions(num_rollouts=1)
    envs = EnvCache(validate_tasks(tasks), tokenizer)
    for path, config in zip(tasks["env_class_path"], tasks["env_config"]):
        envs.get(path, config)
    before = rollout_fingerprint(tasks, agent, tokenizer, opts, envs.fingerprints())
    monkeypatch.setattr(MastermindEnv, "fingerprint", lambda self: {"source": "edited"})
    assert rollout_fingerprint(tasks, agent, tokenizer, opts, envs.fingerprints()) != before


def test_empty_task_dataset_is_a_clear_error(tasks, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="task dataset is empty"):
        run(tasks.select([]), ScriptedAgent(["1"]), tokenizer, tmp_path)


def test_env_rejecting_its_config_is_reported_per_row_whatever_it_raises(tasks, tokenizer, tmp_path, monkeypatch):
    class OddError(Exception):  # an exception whose constructor cannot be called with one message
        def __init__(self, code, detail):
            super().__init__(f"{code}: {detail}")

    def refuse(self, tokenizer, env_config=None):
        raise OddError(7, "unsupported option")

    monkeypatch.setattr(MastermindEnv, "__init__", refuse)
    with pytest.raises(TaskValidationError, match=r"row 0, field 'env_config'.*7: unsupported option"):
        run(tasks, ScriptedAgent(["1"]), tokenizer, tmp_path)
