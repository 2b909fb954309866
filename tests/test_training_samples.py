"""Training on episodes of several samples: every sample is a training row with its episode's advantage.

The multi-sample rollouts come from the real pipeline: an env played with ``template_mode: "render"`` on the Qwen3
template (thinking on) by the real TransformersAgent on the tiny model, whose reasoning blocks the template drops
from history, so episodes branch. A dataset written before the sample columns trains as before.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from test_chat_templates import biased_to_stop_and_reason, family_tokenizer
from test_training import handmade_rollouts

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.envs.base import MultistepEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.schema import SAMPLE_COLUMNS
from hf_rollouts.training import (
    RolloutCollator,
    UpdateConfig,
    grpo_update,
    prepare_rollouts,
    shuffle_advantages,
)


class LengthEnv(MultistepEnv):
    """Three turns; each answer earns its length modulo 3, halved (rewards that differ within a group)."""

    default_max_turns = 3

    def _initialize_episode(self, session_id: str, task_data: dict[str, Any]) -> dict[str, Any]:
        return {"k": task_data["k"], "turns": 0}

    def _format_prompt(self, state: dict[str, Any], step: int) -> str:
        return f"Task {state['k']}: say something." if step == 0 else "Again."

    def _step_episode(self, session_id: str, state: dict[str, Any], action: str):
        state["turns"] += 1
        return state, (len(action) % 3) / 2, state["turns"] == 3, {}


@pytest.fixture(scope="module")
def qwen3_policy(tiny):
    """The tiny model with the Qwen3 template's tokens, biased towards its end token and reasoning tags."""
    model, base = tiny
    tok = family_tokenizer(base, "qwen3")
    model = biased_to_stop_and_reason(model, tok)
    return model, tok


@pytest.fixture(scope="module")
def branched(qwen3_policy, tmp_path_factory):
    model, tok = qwen3_policy
    agent = TransformersAgent(model, tok, temperature=1.0, max_new_tokens=12, seed=0)
    config = {"template_mode": "render", "chat_template_kwargs": {"enable_thinking": True}}
    tasks = [{"env_class_path": f"{__name__}.LengthEnv", "env_config": config, "task_data": {"k": k}} for k in range(3)]
    cache = tmp_path_factory.mktemp("branched")
    return generate_rollouts(tasks, agent, 4, allowed_env_modules=[__name__], cache_dir=cache, progress=False)


def test_the_pipeline_stores_every_sample(branched):
    samples = [n for row in branched["num_samples"] for n in row]
    assert sum(samples) > len(samples)  # episodes branched (the template dropped sampled reasoning)
    for row in branched:
        for k, n in enumerate(row["num_samples"]):
            calls = row["sample_calls"][k]
            assert len(calls) == n and sum(calls) == row["num_turns"][k]
            assert len(row["earlier_token_ids"][k]) == n - 1
            for ids, agent, sampled, rewards in zip(*(row[c][k] for c in SAMPLE_COLUMNS[:4])):
                assert len(ids) == len(agent) == len(sampled) == len(rewards)
                assert all(r == 0.0 for r, m in zip(rewards, agent) if not m)
                assert all(m for s, m in zip(sampled, agent) if s)


def test_every_sample_trains_with_its_episodes_advantage(branched):
    prepared = prepare_rollouts(branched, flatten=True, drop_constant_groups=False, progress=False)
    rows = prepared.dataset
    kept = [(g, k) for g, row in enumerate(branched) for k, s in enumerate(row["statuses"]) if s != "error"]
    assert len(rows) == sum(branched[g]["num_samples"][k] for g, k in kept)  # one training row per sample
    by_rollout: dict[tuple[int, int], list[dict]] = {}
    for row in rows:
        by_rollout.setdefault((row["group_id"], row["rollout_index"]), []).append(row)
    for (g, k), members in by_rollout.items():
        n = branched[g]["num_samples"][k]
        assert [m["sample_index"] for m in members] == list(range(n))
        assert len({m["advantage"] for m in members}) == 1  # the episode's advantage on each of its samples
        earlier = branched[g]["earlier_token_ids"][k]
        assert [m["input_ids"] for m in members[:-1]] == earlier
        last = members[-1]["input_ids"]
        assert branched[g]["padded_full_token_ids"][k][: len(last)] == last
    # each sampled token is in exactly one sample: the loss tokens of an episode's rows are its sampled tokens
    batch = RolloutCollator(0)(list(rows))
    assert int(batch["loss_mask"].sum()) == sum(sum(r["sampled_mask"]) for r in rows)


def test_grpo_update_steps_on_every_sample(branched, qwen3_policy):
    model, tok = qwen3_policy
    model = copy.deepcopy(model)
    prepared = prepare_rollouts(branched, flatten=True, drop_constant_groups=False, progress=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = grpo_update(
        model, optimizer, prepared, pad_token_id=tok.pad_token_id, config=UpdateConfig(minibatch_size=4)
    )
    assert metrics.rollouts == len(prepared.dataset) and metrics.steps == math.ceil(len(prepared.dataset) / 4)
    assert math.isfinite(metrics.loss) and metrics.grad_norm > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_the_control_run_moves_an_episodes_advantage_as_one(branched):
    rows = prepare_rollouts(branched, flatten=True, drop_constant_groups=False, progress=False).dataset
    shuffled = shuffle_advantages(rows, seed=1)
    advantage: dict[tuple[int, int], set] = {}
    for row in shuffled:
        advantage.setdefault((row["group_id"], row["rollout_index"]), set()).add(row["advantage"])
    assert all(len(values) == 1 for values in advantage.values())
    real = {(r["group_id"], r["rollout_index"]): r["advantage"] for r in rows}
    for g in set(rows["group_id"]):  # a permutation of the group's episode advantages
        control = sorted(v for (gg, _), values in advantage.items() if gg == g for v in values)
        assert control == pytest.approx(sorted(a for (gg, _), a in real.items() if gg == g))


def test_a_dataset_written_before_the_sample_columns_trains_as_before(tiny):
    model, tok = tiny
    new = handmade_rollouts()
    old = new.remove_columns(["num_samples", "sample_calls", *SAMPLE_COLUMNS])
    flat_new = prepare_rollouts(new, flatten=True, progress=False).dataset
    flat_old = prepare_rollouts(old, flatten=True, progress=False).dataset
    assert len(flat_old) == len(flat_new) > 0
    assert str(flat_old.to_list()) == str(flat_new.to_list()) and set(flat_old["sample_index"]) == {0}
    unflat = prepare_rollouts(old, progress=False).dataset
    assert "earlier_token_ids" not in unflat.column_names
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = grpo_update(model, optimizer, flat_old, pad_token_id=tok.pad_token_id, temperature=1.0)
    assert metrics.rollouts == len(flat_old) and math.isfinite(metrics.loss)


def test_samples_survive_saving_to_disk_and_parquet(branched, tmp_path):
    """The nested per-rollout columns round-trip through save_to_disk and parquet, and train the same rows."""
    branched.save_to_disk(str(tmp_path / "saved"))
    branched.to_parquet(str(tmp_path / "rollouts.parquet"))
    expected = prepare_rollouts(branched, flatten=True, drop_constant_groups=False, progress=False).dataset
    for source in (tmp_path / "saved", tmp_path / "rollouts.parquet"):
        rows = prepare_rollouts(str(source), flatten=True, drop_constant_groups=False, progress=False).dataset
        assert rows["input_ids"] == expected["input_ids"] and rows["sample_index"] == expected["sample_index"]
        assert rows["old_logprobs"] == expected["old_logprobs"]


def test_the_card_statistics_count_the_samples(branched):
    from hf_rollouts.publish import compute_stats

    stats = compute_stats(branched)
    total = sum(n for row in branched["num_samples"] for n in row)
    assert stats.samples == total > stats.rollouts
    assert (
        "samples",
        f"{total} ({total - stats.rollouts} branches; tokens per episode count each one's last sample)",
    ) in stats.table()
    old = compute_stats(branched.remove_columns(["num_samples", "sample_calls", *SAMPLE_COLUMNS]))
    assert old.samples == old.rollouts and not any(name == "samples" for name, _ in old.table())


@pytest.mark.parametrize("dropped", [list(SAMPLE_COLUMNS), ["earlier_logprobs"], ["earlier_token_ids"]])
def test_missing_earlier_columns_of_a_branched_dataset_are_refused(branched, dropped):
    """A select_columns that leaves out earlier_* columns of rollouts of several samples: a ValueError naming them,
    not training on the last sample only. Without them an append-only dataset still trains."""
    partial = branched.remove_columns(dropped)
    for flatten in (True, False):
        with pytest.raises(ValueError, match=r"lacks the earlier samples' column\(s\) \[") as info:
            prepare_rollouts(partial, flatten=flatten, drop_constant_groups=False, progress=False)
        assert all(c in str(info.value) for c in dropped) and "row " in str(info.value)
    single = handmade_rollouts().remove_columns(dropped)  # every rollout one sample: nothing is lost
    assert len(prepare_rollouts(single, flatten=True, progress=False).dataset) > 0
