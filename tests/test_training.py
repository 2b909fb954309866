"""hf_rollouts.training: loading and filtering, advantages, collation, token log-probs, the GRPO loss, and learning."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset, Features
from torch.utils.data import DataLoader

from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import parquet_files, save_rollouts
from hf_rollouts.schema import ROLLOUT_FEATURES, SAMPLE_COLUMNS, TASK_FEATURES, encode_task_row
from hf_rollouts.training import (
    FLAT_FEATURES,
    RolloutCollator,
    group_advantages,
    grpo_loss,
    load_rollouts,
    prepare_rollouts,
    token_logprobs,
)

NAN = math.nan
P = 7  # pad id of the handmade data
EPS = 1e-6
ROOT = Path(__file__).resolve().parents[1]


def _rollout(ids, agent, rewards, logprobs, final, status, turns=1, error=None):
    return dict(
        ids=ids, agent=agent, rewards=rewards, logprobs=logprobs, final=final, status=status, turns=turns, error=error
    )


# Three groups. Group 0: a win, a truncated loss and an error. Group 1: all truncated, all 0 (constant).
# Group 2: three wins of different size; one rollout has a NaN log-prob on an agent token, one has none at all.
GROUPS = [
    [
        _rollout(
            [11, 12, 13, 14, 15, 16],
            [0, 0, 1, 1, 0, 1],
            [0, 0, 0, 1.0, 0, 0],
            [0, 0, -0.5, -0.25, 0, -1.0],
            1.0,
            "done",
            2,
        ),
        _rollout([21, 22, 23, 24], [0, 0, 1, 1], [0, 0, 0, 0], [0, 0, -2.0, -3.0], 0.0, "truncated"),
        _rollout([31, 32, 33], [0, 0, 1], [0, 0, 0], [0, 0, -0.1], NAN, "error", error="RuntimeError: boom"),
    ],
    [
        _rollout([41, 42, 43, 44], [0, 0, 1, 1], [0] * 4, [0, 0, -1.0, -1.0], 0.0, "truncated"),
        _rollout([51, 52, 53], [0, 0, 1], [0] * 3, [0, 0, -1.0], 0.0, "truncated"),
        _rollout([61, 62, 63, 64], [0, 0, 1, 1], [0] * 4, [0, 0, -1.0, -1.0], 0.0, "truncated"),
    ],
    [
        _rollout([71, 72, 73, 74, 75], [0, 0, 1, 1, 1], [0, 0, 0, 0, 2.0], [0, 0, -1.0, NAN, -1.0], 2.0, "done"),
        _rollout([81, 82, 83, 84], [0, 0, 1, 1], [0, 0, 0, 0.5], None, 0.5, "done"),
        _rollout([91, 92, 93, 94, 95], [0, 0, 0, 1, 1], [0, 0, 0, 0, 1.0], [0, 0, 0, -0.5, -0.5], 1.0, "done"),
    ],
]


def _pad(seq, width, value):
    return None if seq is None else list(seq) + [value] * (width - len(seq))


def handmade_rollouts() -> Dataset:
    """A rollout dataset in the real schema (TASK_FEATURES + ROLLOUT_FEATURES), padded per task like the pipeline."""
    rows = []
    for g, group in enumerate(GROUPS):
        w = max(len(r["ids"]) for r in group)
        rows.append(
            {
                "env_class_path": "hf_rollouts.envs.guess_number.GuessNumberEnv",
                "env_config": {"low": 1, "high": 4},
                "task_data": {"target": g + 1},
                "padded_full_token_ids": [_pad(r["ids"], w, P) for r in group],
                "padded_full_attention_mask": [_pad([1] * len(r["ids"]), w, 0) for r in group],
                "padded_agent_token_mask": [_pad(r["agent"], w, 0) for r in group],
                # token-level agent: every agent id was sampled; the text-only rollout (no log-probs) was re-tokenized
                "padded_sampled_token_mask": [
                    _pad(r["agent"] if r["logprobs"] else [0] * len(r["ids"]), w, 0) for r in group
                ],
                "padded_per_token_rewards": [_pad(r["rewards"], w, 0.0) for r in group],
                "padded_logprobs": [_pad(r["logprobs"], w, 0.0) for r in group],
                "final_rewards": [r["final"] for r in group],
                "num_turns": [r["turns"] for r in group],
                "statuses": [r["status"] for r in group],
                "solved": [r["status"] != "error" and r["final"] >= 1.0 for r in group],
                "errors": [r["error"] for r in group],
                "conversations": [[{"role": "user", "content": "Guess."}] for _ in group],
                "num_cut_turns": [0 for _ in group],
                "padded_tool_token_mask": [_pad([0] * len(r["ids"]), w, 0) for r in group],
                "num_tool_calls": [0 for _ in group],
                "num_tool_errors": [0 for _ in group],
                "tool_calls": [[] for _ in group],
                "logprob_settings": [None for _ in group],  # a hand-made dataset: nothing recorded
                "infos": [None for _ in group],
                "num_samples": [1 for _ in group],  # append-only: one sample each, in the padded columns
                "sample_calls": [[r["turns"]] for r in group],
                **{name: [[] for _ in group] for name in SAMPLE_COLUMNS},
                "policy_versions": [None for _ in group],
            }
        )
    unknown = set(ROLLOUT_FEATURES) - set(rows[0])
    assert not unknown, f"ROLLOUT_FEATURES gained {unknown}: give the handmade rollouts these columns too"
    rows = [encode_task_row(row) for row in rows]  # env_config / task_data as stored: JSON text
    return Dataset.from_list(rows, features=Features({**TASK_FEATURES, **ROLLOUT_FEATURES}))


def _nan_safe(x):
    """``x`` with every float NaN replaced by the string "nan", so that == compares NaNs as equal."""
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, dict):
        return {k: _nan_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_safe(v) for v in x]
    return x


def _by_key(flat: Dataset) -> dict[tuple[int, int], dict]:
    return {(r["group_id"], r["rollout_index"]): r for r in flat}


G2 = [2.0, 0.5, 1.0]
G2_MEAN = sum(G2) / 3
G2_STD = math.sqrt(sum((r - G2_MEAN) ** 2 for r in G2) / 3)  # population std


# --------------------------------------------------------------------------- loading, advantages, filtering


def test_flatten_trims_and_scores_each_rollout_within_its_group():
    prepared = prepare_rollouts(handmade_rollouts(), flatten=True)
    flat, report = prepared.dataset, prepared.report
    assert flat.features == FLAT_FEATURES
    rows = _by_key(flat)
    assert sorted(rows) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]  # the error (0, 2) is gone
    r = rows[(0, 1)]  # trimmed to its real length: no per-task padding left
    assert (
        r["input_ids"] == [21, 22, 23, 24] and r["attention_mask"] == [1, 1, 1, 1] and r["agent_mask"] == [0, 0, 1, 1]
    )
    assert r["old_logprobs"] == [0, 0, -2.0, -3.0] and r["status"] == "truncated" and r["final_reward"] == 0.0
    assert rows[(2, 1)]["old_logprobs"] is None and rows[(2, 1)]["input_ids"] == [81, 82, 83, 84]
    assert rows[(2, 1)]["sampled_mask"] == [0, 0, 0, 0] and rows[(0, 0)]["sampled_mask"] == [0, 0, 1, 1, 0, 1]
    assert math.isnan(rows[(2, 0)]["old_logprobs"][3])
    assert rows[(0, 0)]["num_turns"] == 2 and rows[(0, 0)]["advantage_mode"] == "grpo"
    # group 0: non-error rewards [1, 0]: mean 0.5, population std 0.5; the error never enters the statistics
    assert rows[(0, 0)]["advantage"] == pytest.approx(0.5 / (0.5 + EPS))
    assert rows[(0, 1)]["advantage"] == pytest.approx(-0.5 / (0.5 + EPS))
    for k, r in enumerate(G2):
        assert rows[(2, k)]["advantage"] == pytest.approx((r - G2_MEAN) / (G2_STD + EPS), rel=1e-6)
    assert all(rows[(1, k)]["advantage"] == 0.0 for k in range(3))  # constant group: no signal
    assert report.to_dict() == {
        "groups_in": 3,
        "rollouts_in": 9,
        "errors": 1,
        "errors_dropped": 1,
        "truncated": 4,
        "truncated_dropped": 0,
        "constant_groups": 1,
        "constant_groups_dropped": 0,
        "constant_group_rollouts_dropped": 0,
        "groups_out": 3,
        "rollouts_out": 8,
    }


@pytest.mark.parametrize("mode", ["grpo", "mean_baseline"])
def test_advantages_sum_to_zero_per_group(mode, hf_agent, tokenizer, tmp_path):
    tasks = GuessNumberEnv(tokenizer, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(6)
    real = generate_rollouts(tasks, hf_agent, 5, seed=3, cache_dir=tmp_path, progress=False)
    for ds in (handmade_rollouts(), real):
        flat = prepare_rollouts(ds, flatten=True, advantage=mode).dataset
        groups: dict[int, list[float]] = {}
        for row in flat:
            groups.setdefault(row["group_id"], []).append(row["advantage"])
        assert groups
        for advantages in groups.values():
            assert sum(advantages) == pytest.approx(0.0, abs=1e-5)
    mb = _by_key(prepare_rollouts(handmade_rollouts(), flatten=True, advantage="mean_baseline").dataset)
    assert [mb[(0, 0)]["advantage"], mb[(0, 1)]["advantage"]] == [0.5, -0.5]
    assert mb[(2, 0)]["advantage"] == pytest.approx(2.0 - G2_MEAN)


def test_group_advantages_contract():
    assert group_advantages([3.0, 1.0, NAN], ["done", "done", "error"], "grpo", eps=0.0) == [
        1.0,
        -1.0,
        pytest.approx(NAN, nan_ok=True),
    ]
    assert all(math.isnan(a) for a in group_advantages([1.0, 0.0], ["done", "done"], "per_token"))
    assert all(math.isnan(a) for a in group_advantages([NAN, NAN], ["error", "error"], "grpo"))
    assert group_advantages([5.0], ["done"], "grpo") == [0.0]
    with pytest.raises(ValueError, match="advantage must be one of"):
        group_advantages([1.0], ["done"], "ppo")


def test_errors_are_dropped_and_counted_and_never_trained_on_as_zero():
    prepared = prepare_rollouts(handmade_rollouts(), flatten=True)
    assert prepared.report.errors == prepared.report.errors_dropped == 1
    assert all(r["status"] != "error" for r in prepared.dataset)

    kept = prepare_rollouts(handmade_rollouts(), flatten=True, drop_errors=False)
    assert kept.report.errors == 1 and kept.report.errors_dropped == 0 and kept.report.rollouts_out == 9
    err = _by_key(kept.dataset)[(0, 2)]
    assert err["status"] == "error" and math.isnan(err["final_reward"]) and math.isnan(err["advantage"])
    for mode in (None, "per_token"):
        batch = RolloutCollator(P, advantage=mode)([err])
        assert batch["loss_mask"].sum() == 0 and batch["advantages"].abs().sum() == 0
        logprobs = torch.full(batch["input_ids"].shape, -1.0, requires_grad=True)
        loss, metrics = grpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"])
        loss.backward()
        assert loss.item() == 0.0 and metrics["num_tokens"] == 0 and logprobs.grad.abs().sum() == 0


def test_truncated_kept_by_default_or_dropped_by_flag_after_scoring():
    default = prepare_rollouts(handmade_rollouts(), flatten=True)
    assert default.report.truncated == 4 and default.report.truncated_dropped == 0
    assert sum(r["status"] == "truncated" for r in default.dataset) == 4

    dropped = prepare_rollouts(handmade_rollouts(), flatten=True, keep_truncated=False)
    rows = _by_key(dropped.dataset)
    assert all(r["status"] != "truncated" for r in dropped.dataset)
    assert dropped.report.truncated_dropped == 4 and dropped.report.rollouts_out == 4 and dropped.report.groups_out == 2
    # the advantage was computed with the truncated loss in the group, before dropping it
    assert rows[(0, 0)]["advantage"] == pytest.approx(0.5 / (0.5 + EPS))


def test_constant_groups_dropped_and_counted():
    prepared = prepare_rollouts(handmade_rollouts(), flatten=True, drop_constant_groups=True)
    report = prepared.report
    assert {r["group_id"] for r in prepared.dataset} == {0, 2}
    assert report.constant_groups == report.constant_groups_dropped == 1
    assert report.constant_group_rollouts_dropped == 3 and report.rollouts_out == 5
    both = prepare_rollouts(handmade_rollouts(), flatten=True, drop_constant_groups=True, keep_truncated=False).report
    assert both.constant_groups_dropped == 1 and both.constant_group_rollouts_dropped == 0  # counted once, as truncated
    for r in (report, both, prepare_rollouts(handmade_rollouts(), flatten=True, drop_errors=False).report):
        assert (
            r.rollouts_in == r.rollouts_out + r.errors_dropped + r.truncated_dropped + r.constant_group_rollouts_dropped
        )


def test_unflattened_rows_keep_the_task_layout_with_kept_rollouts_only():
    prepared = prepare_rollouts(handmade_rollouts(), drop_constant_groups=True)
    ds = prepared.dataset
    assert len(ds) == 2 and [json.loads(t) for t in ds["task_data"]] == [{"target": 1}, {"target": 3}]
    first = ds[0]
    assert first["rollout_indices"] == [0, 1] and first["statuses"] == ["done", "truncated"]
    assert first["padded_full_token_ids"][1] == [21, 22, 23, 24, P, P]  # still padded to the task's width
    assert first["advantages"] == pytest.approx([0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)])
    assert load_rollouts(handmade_rollouts(), drop_constant_groups=True)["rollout_indices"] == ds["rollout_indices"]


def test_loads_from_disk_parquet_and_hub_id(tmp_path, monkeypatch):
    ds = handmade_rollouts()
    out = save_rollouts(ds, tmp_path / "rollouts")
    expected = _nan_safe(prepare_rollouts(ds, flatten=True).dataset.to_list())
    sources = [out, str(out / "parquet"), parquet_files(out)[0], str(out / "parquet" / "*.parquet")]
    for source in sources:
        prepared = prepare_rollouts(source, flatten=True)
        assert _nan_safe(prepared.dataset.to_list()) == expected, source
        assert prepared.report.errors_dropped == 1
    import hf_rollouts.sources as training

    calls = []

    def fake_hub(path, split=None, **kwargs):  # the network boundary
        calls.append((path, split))
        return ds

    monkeypatch.setattr(training, "load_dataset", fake_hub)
    assert _nan_safe(load_rollouts("someone/rollouts", flatten=True, split="train").to_list()) == expected
    assert calls == [("someone/rollouts", "train")]
    with pytest.raises(FileNotFoundError, match="save_rollouts"):
        prepare_rollouts(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_rollouts(tmp_path / "typo")
    with pytest.raises(ValueError, match="not a rollout dataset"):
        prepare_rollouts(prepare_rollouts(ds, flatten=True).dataset)


# --------------------------------------------------------------------------- collation


def test_collator_pads_right_and_masks_exactly():
    rows = _by_key(prepare_rollouts(handmade_rollouts(), flatten=True).dataset)
    batch = RolloutCollator(P)([rows[(0, 0)], rows[(0, 1)], rows[(2, 0)], rows[(2, 1)]])
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (4, 6),
        "attention_mask": (4, 6),
        "loss_mask": (4, 6),
        "per_token_rewards": (4, 6),
        "advantages": (4, 6),
        "old_logprobs": (4, 6),
        "agent_mask": (4, 6),
        "final_rewards": (4,),
        "group_ids": (4,),
        "logprob_temperature": (4,),
    }
    assert batch["input_ids"].dtype == torch.long and batch["loss_mask"].dtype == torch.float32
    assert batch["input_ids"].tolist() == [
        [11, 12, 13, 14, 15, 16],
        [21, 22, 23, 24, P, P],
        [71, 72, 73, 74, 75, P],
        [81, 82, 83, 84, P, P],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 4 + [0] * 2]
    assert batch["loss_mask"].tolist() == [
        [0, 0, 1, 1, 0, 1],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 0, 1, 0],  # the NaN old log-prob at position 3 is excluded
        [0, 0, 0, 0, 0, 0],  # no old log-probs at all (text-only agent)
    ]
    assert batch["old_logprobs"].tolist() == [
        [0, 0, -0.5, -0.25, 0, -1.0],
        [0, 0, -2.0, -3.0, 0, 0],
        [0, 0, -1.0, 0, -1.0, 0],
        [0] * 6,
    ]
    assert batch["per_token_rewards"].tolist() == [
        [0, 0, 0, 1.0, 0, 0],
        [0] * 6,
        [0, 0, 0, 0, 2.0, 0],
        [0, 0, 0, 0.5, 0, 0],
    ]
    a0, a1, a2 = 0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), (2.0 - G2_MEAN) / (G2_STD + EPS)
    expected = torch.tensor([[0, 0, a0, a0, 0, a0], [0, 0, a1, a1, 0, 0], [0, 0, a2, 0, a2, 0], [0] * 6])
    torch.testing.assert_close(batch["advantages"], expected.float())
    assert batch["group_ids"].tolist() == [0, 0, 2, 2] and batch["final_rewards"].tolist() == [1.0, 0.0, 2.0, 0.5]

    per_token = RolloutCollator(P, advantage="per_token")([rows[(0, 0)], rows[(2, 0)]])
    assert per_token["advantages"].tolist() == [[0, 0, 0, 1.0, 0, 0], [0, 0, 0, 0, 2.0, 0]]

    with pytest.raises(ValueError, match="prepared with advantage='grpo'"):
        RolloutCollator(P, advantage="mean_baseline")([rows[(0, 0)]])
    with pytest.raises(ValueError, match="without old log-probabilities"):
        RolloutCollator(P, missing_logprobs="raise")([rows[(2, 1)]])
    assert RolloutCollator(P, pad_to_multiple_of=4)([rows[(0, 1)]])["input_ids"].shape == (1, 4)
    assert RolloutCollator(P, pad_to_multiple_of=4)([rows[(2, 0)]])["input_ids"].shape == (1, 8)


def test_collator_works_with_dataloader_and_accelerate():
    from accelerate import Accelerator

    flat = prepare_rollouts(handmade_rollouts(), flatten=True).dataset
    collator = RolloutCollator(P)
    plain = list(DataLoader(flat, batch_size=3, collate_fn=collator))
    assert [b["input_ids"].shape[0] for b in plain] == [3, 3, 2]
    accelerator = Accelerator(cpu=True)
    prepared = accelerator.prepare(DataLoader(flat, batch_size=3, collate_fn=collator))
    batches = list(prepared)
    assert [b["input_ids"].shape[0] for b in batches] == [3, 3, 2]
    for a, b in zip(plain, batches):
        for key in a:
            torch.testing.assert_close(a[key], b[key].cpu(), rtol=0, atol=0, equal_nan=True, msg=key)
    assert batches[0]["loss_mask"].device.type == accelerator.device.type  # cuda:0 is cuda: compare kinds


# --------------------------------------------------------------------------- log-probs and loss


@pytest.fixture()
def real_batch(tiny, tmp_path):
    """Flattened, collated real rollouts (2 turns, tiny model, temperature 0.7)."""
    from hf_rollouts.agents.hf import TransformersAgent

    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=0.7, max_new_tokens=5, seed=0)
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(4)
    rollouts = generate_rollouts(tasks, agent, 3, seed=5, cache_dir=tmp_path, progress=False)
    flat = prepare_rollouts(rollouts, flatten=True).dataset
    # make the advantages non-zero even if every reward is equal: this batch tests gradients, not scores
    flat = flat.map(lambda r, i: {"advantage": 1.0 if i % 2 else -0.5}, with_indices=True)
    return model, RolloutCollator(tok.pad_token_id)(list(flat))


def test_token_logprobs_match_the_sampling_logprobs(real_batch, tiny):
    model, batch = real_batch
    mask = batch["loss_mask"].bool()
    assert mask.sum() > 0 and (batch["input_ids"].shape[1] > batch["attention_mask"].sum(1)).any()  # padded batch
    with torch.no_grad():  # a CPU batch, the model wherever the agent put it: token_logprobs moves the batch
        lp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=0.7)
    assert lp.device == model.device
    lp = lp.cpu()
    torch.testing.assert_close(lp[mask], batch["old_logprobs"][mask], atol=1e-4, rtol=1e-4)
    assert (lp[:, 0] == 0).all() and (lp[batch["attention_mask"] == 0] == 0).all()
    # position t = log_softmax(logits(ids[:t]) / T)[ids[t]], computed by hand for one agent token
    i, t = (int(x) for x in mask.nonzero()[0])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"][i : i + 1, :t].to(model.device)).logits[0, -1].cpu()
    assert lp[i, t].item() == pytest.approx(
        torch.log_softmax(logits / 0.7, -1)[batch["input_ids"][i, t]].item(), abs=1e-5
    )


def test_token_logprobs_with_a_loss_mask_run_the_head_from_the_first_loss_token_only(real_batch):
    model, batch = real_batch
    mask = batch["loss_mask"]
    first = int(mask.bool().any(0).nonzero()[0])
    assert first > 1  # the prompt is skipped
    seen = {}
    handle = model.register_forward_hook(
        lambda m, a, kw, out: seen.update(kw=kw, width=out.logits.shape[1]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            full = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 0.7)
            kept = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 0.7, loss_mask=mask)
    finally:
        handle.remove()
    assert seen["kw"]["logits_to_keep"] == batch["input_ids"].shape[1] - first + 1 == seen["width"]
    torch.testing.assert_close(kept[:, first:], full[:, first:], atol=1e-5, rtol=1e-5)
    assert kept.shape == full.shape and (kept[:, :first] == 0).all()
    nothing = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 0.7, loss_mask=torch.zeros_like(mask))
    assert (nothing == 0).all() and nothing.shape == full.shape


def test_shared_prefix_gives_the_full_pass_values_and_gradients(tiny):
    """Rows that begin alike (a system prompt, then each its own question and answer, right-padded): the prefix run
    once and its cache repeated over the batch gives the same log-probs and the same parameter gradients."""
    from hf_rollouts.training.loss import common_prefix_length

    model, tok = tiny
    prefix = tok("You are a calculator. Reply with the number.", add_special_tokens=False)["input_ids"]
    rows = [prefix + tok(t, add_special_tokens=False)["input_ids"] for t in ("3 + 4 = 7", "12 + 30 = 42", "1 + 1 = 2")]
    width = max(map(len, rows))
    ids = torch.full((3, width), P)
    attention = torch.zeros(3, width, dtype=torch.long)
    loss_mask = torch.zeros(3, width)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)] = torch.tensor(r), 1
        loss_mask[i, len(prefix) + 2 : len(r)] = 1  # the "answer" part
    assert common_prefix_length(ids, attention) >= len(prefix)

    def run(share: bool):
        model.zero_grad(set_to_none=True)
        lp = token_logprobs(model, ids, attention, 0.7, loss_mask=loss_mask, share_prefix=share)
        (lp * loss_mask).sum().backward()
        return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    try:
        full, full_grads = run(False)
        shared, shared_grads = run(True)
    finally:
        model.zero_grad(set_to_none=True)
    torch.testing.assert_close(shared, full, atol=1e-5, rtol=1e-5)
    assert full_grads.keys() == shared_grads.keys() and len(full_grads) > 2
    for name, grad in full_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    seen = []
    handle = model.register_forward_hook(lambda m, a, kw, out: seen.append(kw["input_ids"].shape), with_kwargs=True)
    try:
        with torch.no_grad():
            token_logprobs(model, ids, attention, 0.7, loss_mask=loss_mask, share_prefix=True)
    finally:
        handle.remove()
    assert seen[0][0] == 1 and seen[0][1] >= len(prefix) and seen[1][0] == 3  # one row for the prefix, then all


def test_gradient_is_exactly_zero_outside_agent_tokens(real_batch):
    model, batch = real_batch
    batch = {k: v.to(model.device) for k, v in batch.items()}  # as a training loop does
    mask = batch["loss_mask"].bool()
    captured = {}

    def keep_logits(module, args, output):
        output.logits.retain_grad()
        captured["logits"] = output.logits

    handle = model.register_forward_hook(keep_logits)
    try:
        logprobs = token_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=0.7)
    finally:
        handle.remove()
    leaf = logprobs.detach().requires_grad_()
    # garbage where the mask is 0 must not leak into the loss or the gradient
    old = torch.where(mask, batch["old_logprobs"], torch.full_like(leaf, NAN))
    adv = torch.where(mask, batch["advantages"], torch.full_like(leaf, math.inf))
    ref = torch.where(mask, leaf.detach() - 0.1, torch.full_like(leaf, NAN))
    loss, metrics = grpo_loss(leaf, old, adv, batch["loss_mask"], kl_coef=0.1, ref_logprobs=ref)
    loss.backward()
    assert torch.isfinite(loss) and metrics["num_tokens"] == int(mask.sum())
    assert (leaf.grad[~mask] == 0).all() and (leaf.grad[mask] != 0).any()

    model.zero_grad()
    loss, _ = grpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"])
    loss.backward()
    logits_grad = captured["logits"].grad  # position t-1 predicts token t
    used = torch.zeros_like(mask)
    used[:, :-1] = mask[:, 1:]
    assert (logits_grad[~used] == 0).all() and (logits_grad[used].abs().sum(-1) > 0).all()
    model.zero_grad()


def test_grpo_loss_matches_hand_computation():
    old = torch.zeros(1, 4)
    logprobs = torch.tensor([[0.5, -0.5, 0.5, 3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, metrics = grpo_loss(logprobs, old, adv, mask, clip_eps=0.2)
    e, ie = math.exp(0.5), math.exp(-0.5)
    # token 0: ratio e^.5 > 1.2 with A > 0 -> clipped at 1.2; token 1: ratio e^-.5, A > 0 -> unclipped;
    # token 2: ratio e^.5 with A < 0 -> min picks the unclipped -e^.5; token 3: masked out
    assert loss.item() == pytest.approx((-1.2 - ie + e) / 3, rel=1e-6)
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -ie / 3, e / 3, 0.0], rel=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(1.0) and metrics["num_tokens"] == 3
    assert metrics["ratio_mean"] == pytest.approx((2 * e + ie) / 3, rel=1e-6)

    ref = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    with_kl, m = grpo_loss(logprobs.detach(), old, adv, mask, kl_coef=0.5, ref_logprobs=ref)
    k3 = [math.exp(-x) + x - 1 for x in (0.5, -0.5, 0.5)]  # exp(ref - lp) - (ref - lp) - 1
    assert m["kl"] == pytest.approx(sum(k3) / 3, rel=1e-6)
    assert with_kl.item() == pytest.approx(loss.item() + 0.5 * sum(k3) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        grpo_loss(logprobs, old, adv, mask, kl_coef=0.1)
    empty, _ = grpo_loss(logprobs, old, adv, torch.zeros(1, 4))
    assert empty.item() == 0.0


# --------------------------------------------------------------------------- learning


def _train_script():
    spec = importlib.util.spec_from_file_location("train_grpo", ROOT / "scripts" / "train_grpo.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


def test_grpo_raises_the_toy_reward_across_seeds(tmp_path):
    script = _train_script()
    starts, ends = [], []
    for seed in (0, 1, 2):
        out = tmp_path / f"seed{seed}"
        cfg = script.TrainConfig(iterations=10, seed=seed, output_dir=str(out), quiet=True)
        history = script.train(cfg)
        assert [s.iteration for s in history] == list(range(10))
        assert all(s.fingerprint_changed for s in history if s.trained_rollouts)  # the rollout cache can never go stale
        assert all(s.errors == 0 for s in history)
        starts.append(history[0].mean_reward)
        ends.append(statistics.fmean(s.mean_reward for s in history[-2:]))
        assert len(json.loads((out / "metrics.json").read_text())) == 10
        assert (out / "learning_curve.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)
    improvements = [e - s for s, e in zip(starts, ends)]
    assert all(d > 0.3 for d in improvements), (starts, ends)  # every seed, by a wide margin
    assert statistics.fmean(improvements) > 2 * statistics.pstdev(starts) + 0.3, (starts, ends)


def test_logprob_gap_is_float32_rounding_for_a_float32_run_and_sees_a_shifted_token(tiny, tmp_path):
    """The sampler-trainer agreement report: ~1e-6 for the generate backend in float32, and a stored log-prob off by
    0.5 on one token shows up as that max and as 0.5 / tokens more in the mean."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.training import logprob_gap

    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=0.7, max_new_tokens=5, seed=0)
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(3)
    rows = prepare_rollouts(generate_rollouts(tasks, agent, 2, seed=1, cache_dir=tmp_path, progress=False),
                            flatten=True, drop_constant_groups=False).dataset  # fmt: skip
    gap = logprob_gap(model, rows, tok.pad_token_id, 0.7, batch_size=4)
    tokens = sum(sum(m) for m in rows["agent_mask"])
    assert gap.tokens == tokens > 0 and gap.max_abs < 1e-4 and 0 <= gap.mean_abs <= gap.max_abs

    def shift(row, i):
        if i == 0:
            at = row["agent_mask"].index(1)
            row["old_logprobs"] = [x + 0.5 if j == at else x for j, x in enumerate(row["old_logprobs"])]
        return row

    shifted = logprob_gap(model, rows.map(shift, with_indices=True), tok.pad_token_id, 0.7, batch_size=4)
    assert shifted.max_abs == pytest.approx(0.5, abs=1e-4)
    assert shifted.mean_abs == pytest.approx(gap.mean_abs + 0.5 / tokens, abs=1e-5)


def test_unflattened_rows_filter_every_per_rollout_column():
    """Columns outside the schema with one entry per rollout (rescore's previous_* and rescored, a user's column)
    lose the dropped rollouts with the schema's; a per-task list column of another length is kept as it is."""
    ds = handmade_rollouts()
    n = [len(r) for r in ds["final_rewards"]]
    ds = ds.add_column("previous_final_rewards", [[float(10 * g + k) for k in range(m)] for g, m in enumerate(n)])
    ds = ds.add_column("rescored", [[k % 2 == 0 for k in range(m)] for m in n])
    ds = ds.add_column("judge_notes", [[f"g{g}r{k}" for k in range(m)] for g, m in enumerate(n)])
    ds = ds.add_column("task_tags", [["a", "b", "c", "d"] for _ in n])  # per task, not per rollout
    out = prepare_rollouts(ds, drop_constant_groups=False, progress=False).dataset
    assert out[0]["rollout_indices"] == [0, 1]  # the error rollout of group 0 dropped
    for g, row in enumerate(out):
        keep = row["rollout_indices"]
        assert row["previous_final_rewards"] == [float(10 * g + k) for k in keep]
        assert row["rescored"] == [k % 2 == 0 for k in keep]
        assert row["judge_notes"] == [f"g{g}r{k}" for k in keep]
        assert len(row["statuses"]) == len(keep) and row["task_tags"] == ["a", "b", "c", "d"]
