"""The training loop pieces (collect, GRPO update, SFT warm start, task files) and the log-prob settings that travel
with the rollouts: recorded by our own agents, handed on by prepare_rollouts and the collator, used and checked by
token_logprobs, and never averaged over two settings."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import warnings

import pytest
import torch
from datasets import concatenate_datasets
from torch.utils.data import DataLoader

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.recipes import task_splits
from hf_rollouts.rounds import collect_rollouts
from hf_rollouts.training import (
    FLAT_FEATURES,
    RolloutCollator,
    RolloutFilterReport,
    UpdateConfig,
    batch_logprobs,
    grpo_update,
    logprob_gap,
    prepare_rollouts,
    read_logprob_convention,
    sft_update,
    shuffle_advantages,
    split_by_logprob_settings,
    token_logprobs,
)


@pytest.fixture()
def model_copy(tiny):
    model, tok = tiny
    return copy.deepcopy(model), tok


def _rollouts(model, tok, tmp_path, temperature=0.7, seed=1, n_tasks=3, **sampling):
    agent = TransformersAgent(model, tok, temperature=temperature, max_new_tokens=4, seed=0, **sampling)
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(n_tasks)
    return generate_rollouts(tasks, agent, 2, seed=seed, cache_dir=tmp_path / f"c{seed}", progress=False), agent


def test_our_agents_record_their_logprob_settings_and_training_hands_them_on(tiny, tmp_path):
    model, tok = tiny
    rollouts, agent = _rollouts(model, tok, tmp_path, temperature=0.7, top_p=0.9, top_k=50)
    records = [r for row in rollouts["logprob_settings"] for r in row]
    assert len(records) == 6 and all(r == records[0] for r in records)
    first = records[0]
    assert first["kind"] == "processed" and first["temperature"] == pytest.approx(0.7)
    assert first["top_p"] == pytest.approx(0.9) and first["top_k"] == 50 and len(first["agent"]) == 16
    convention = read_logprob_convention(rollouts)  # was None for our own agents
    assert convention["temperature"] == 0.7 and convention["kind"] == "processed" and convention["agents"]
    prepared = prepare_rollouts(rollouts, flatten=True, progress=False)
    assert prepared.logprob_convention == convention
    assert all(r["temperature"] == pytest.approx(0.7) for r in prepared.dataset["logprob_settings"])
    batch = RolloutCollator(tok.pad_token_id)(list(prepared.dataset))
    assert batch["logprob_temperature"].tolist() == pytest.approx([0.7] * len(prepared.dataset))
    # recomputed at the recorded temperature without being told: the stored log-probs come back
    with torch.no_grad():
        new = batch_logprobs(model, batch).cpu()
    mask = batch["loss_mask"].bool()
    assert mask.any()
    torch.testing.assert_close(new[mask], batch["old_logprobs"][mask], atol=1e-4, rtol=1e-4)
    # told another temperature: refused in one line that says how to fix it
    with pytest.raises(ValueError, match=r"temperature=1\b.*leave temperature unset") as refused:
        recorded = batch["logprob_temperature"]
        token_logprobs(model, batch["input_ids"], batch["attention_mask"], 1.0, recorded_temperature=recorded)
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="leave temperature unset"):
        token_logprobs(model, batch["input_ids"], temperature=1.0, convention=prepared.logprob_convention)
    # saved and loaded back, the record is still there
    rollouts.save_to_disk(str(tmp_path / "saved"))
    assert prepare_rollouts(str(tmp_path / "saved"), flatten=True, progress=False).logprob_convention == convention


def test_two_runs_of_different_settings_are_refused_or_split_never_averaged(tiny, tmp_path):
    model, tok = tiny
    warm, _ = _rollouts(model, tok, tmp_path, temperature=0.7, seed=1)
    hot, _ = _rollouts(model, tok, tmp_path, temperature=1.0, seed=2)
    mixed = concatenate_datasets([warm, hot])
    with pytest.raises(ValueError, match="mix log-prob settings.*split_by_logprob_settings"):
        prepare_rollouts(mixed, flatten=True)
    parts = split_by_logprob_settings(mixed)
    assert [len(p) for p in parts.values()] == [len(warm), len(hot)]
    prepared = [prepare_rollouts(p, flatten=True, progress=False) for p in parts.values()]
    temperatures = [p.logprob_convention["temperature"] for p in prepared]
    assert temperatures == [0.7, 1.0]
    # rows of one setting from two versions of the policy are fine: each stored log-prob is its own sample's
    with torch.no_grad():
        next(model.parameters()).add_(1e-3)
    try:
        later, _ = _rollouts(model, tok, tmp_path, temperature=0.7, seed=3)
    finally:
        with torch.no_grad():
            next(model.parameters()).sub_(1e-3)
    both = prepare_rollouts(concatenate_datasets([warm, later]), flatten=True, progress=False)
    assert len(both.logprob_convention["agents"]) == 2


def test_flattened_runs_of_two_settings_are_refused_up_front_or_computed_row_by_row(model_copy, tmp_path):
    """Issue 46, item 3: concatenated flattened rows of two runs (T 0.7 and T 1.0) are refused by grpo_update and
    logprob_gap before any step, even when no minibatch mixes them (size 1); a collator batch that mixes them is
    computed row by row, each row as it would be alone, so nothing depends on where batches fall."""
    model, tok = model_copy
    warm, _ = _rollouts(model, tok, tmp_path, temperature=0.7, seed=1)
    hot, _ = _rollouts(model, tok, tmp_path, temperature=1.0, seed=2)
    flat = [prepare_rollouts(r, flatten=True, progress=False).dataset for r in (warm, hot)]
    mixed = concatenate_datasets(flat)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(ValueError, match="mix log-prob settings.*split_by_logprob_settings"):
        grpo_update(model, optimizer, mixed, pad_token_id=tok.pad_token_id, config=UpdateConfig(minibatch_size=1))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # refused before the first step
    with pytest.raises(ValueError, match="mix log-prob settings"):
        logprob_gap(model, mixed, tok.pad_token_id, batch_size=1)
    assert [len(p) for p in split_by_logprob_settings(mixed).values()] == [len(f) for f in flat]  # flat rows split
    rows = [flat[0][0], flat[1][0]]
    collate = RolloutCollator(tok.pad_token_id)
    batch = collate(rows)
    assert batch["logprob_temperature"].tolist() == pytest.approx([0.7, 1.0])
    with torch.no_grad():
        together = batch_logprobs(model, batch).cpu()
        for i, row in enumerate(rows):
            alone = batch_logprobs(model, collate([row])).cpu()[0]
            n = len(row["input_ids"])
            torch.testing.assert_close(together[i, :n], alone, atol=1e-5, rtol=1e-5)
    mask = batch["loss_mask"].bool()
    torch.testing.assert_close(together[mask], batch["old_logprobs"][mask], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="leave temperature unset"):  # one temperature for both is still refused
        batch_logprobs(model, batch, 1.0)


def test_token_logprobs_says_which_temperature_it_assumed(tiny):
    model, _ = tiny
    ids = torch.tensor([[1, 2, 3, 4]], device=model.device)
    with torch.no_grad(), pytest.warns(UserWarning, match="computed at temperature 1.0.*pass temperature="):
        assumed = token_logprobs(model, ids)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(assumed, token_logprobs(model, ids, temperature=1.0))  # said: no warning
        token_logprobs(model, ids, recorded_temperature=torch.tensor([0.7]))  # recorded: no warning


def test_grpo_update_steps_minibatches_clips_and_leaves_the_policy_in_eval_mode(model_copy, tmp_path):
    model, tok = model_copy
    rollouts = collect_rollouts(
        GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(4),
        TransformersAgent(model, tok, temperature=0.7, max_new_tokens=4, seed=0),
        4,
        seed=7,
    )
    prepared = prepare_rollouts(rollouts, flatten=True, progress=False)
    rows = prepared.dataset.map(lambda r, i: {"advantage": 1.0 if i % 2 else -1.0}, with_indices=True)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = UpdateConfig(minibatch_size=5, epochs=2, max_grad_norm=0.5)
    m = grpo_update(model, optimizer, rows, pad_token_id=tok.pad_token_id, config=config, seed=3)
    assert m.steps == 2 * math.ceil(len(rows) / 5) and m.rollouts == len(rows)
    assert not model.training and m.grad_norm > 0 and 0 <= m.clip_fraction <= 1 and m.kl == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="needs ref_model"):
        grpo_update(model, optimizer, rows, pad_token_id=tok.pad_token_id, config=UpdateConfig(kl_coef=0.1))
    ref = copy.deepcopy(model)
    lr0 = torch.optim.SGD(model.parameters(), lr=0.0)
    kl = grpo_update(
        model, lr0, prepared, pad_token_id=tok.pad_token_id, config=UpdateConfig(kl_coef=0.1), ref_model=ref
    )
    assert kl.kl == pytest.approx(0.0, abs=1e-6)  # the policy is its own reference: no divergence
    empty = grpo_update(model, optimizer, rows.select([]), pad_token_id=tok.pad_token_id)
    assert empty.steps == 0 and math.isnan(empty.loss)


def test_sft_update_is_the_token_mean_nll_of_the_agent_tokens_only(model_copy, tmp_path):
    model, tok = model_copy
    rollouts, _ = _rollouts(model, tok, tmp_path, temperature=1.0)
    rows = prepare_rollouts(rollouts, flatten=True, drop_errors=False, progress=False).dataset
    batch = RolloutCollator(tok.pad_token_id)(list(rows))
    with torch.no_grad():
        lp = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 1.0).cpu()
    agent = batch["agent_mask"]
    assert 0 < agent.sum() < batch["attention_mask"].sum()  # prompts and env text are not agent tokens
    expected = float(-(lp * agent).sum() / agent.sum())
    frozen = torch.optim.SGD(model.parameters(), lr=0.0)
    (loss,) = sft_update(model, frozen, rows, pad_token_id=tok.pad_token_id, steps=1, batch_size=len(rows))
    assert loss == pytest.approx(expected, rel=1e-4) and not model.training
    losses = sft_update(model, torch.optim.AdamW(model.parameters(), lr=1e-2), rows, pad_token_id=tok.pad_token_id,
                        steps=8, batch_size=len(rows))  # fmt: skip
    assert len(losses) == 8 and losses[-1] < losses[0]


def test_collect_rollouts_never_replays_a_cache_and_samples_in_eval_mode(tiny, tmp_path):
    from hf_rollouts.agents import ScriptedAgent

    model, tok = tiny
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 1}).get_train_dataset(2)
    agent = ScriptedAgent(["2"])
    generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path, progress=False, tokenizer=tok)
    assert agent.calls == 4
    generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path, progress=False, tokenizer=tok)
    assert agent.calls == 4  # generate_rollouts' default: the same call is served from its cache
    collect_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path, tokenizer=tok)
    assert agent.calls == 8  # collect_rollouts plays again
    model.train()
    collect_rollouts(tasks, TransformersAgent(model, tok, max_new_tokens=2, seed=0), 1, seed=0)
    assert not model.training


def test_prepare_rollouts_can_be_quiet(tiny, tmp_path, capfd):
    import datasets

    model, tok = tiny
    rollouts, _ = _rollouts(model, tok, tmp_path)
    # datasets' switch is process-wide, and an earlier test in the same process can leave it off (the suite showed
    # no bar here after other tests, while this file alone did): start from the default, bars on
    datasets.enable_progress_bars()
    capfd.readouterr()
    prepare_rollouts(rollouts, flatten=True)
    assert "flatten rollouts" in capfd.readouterr().err  # the default shows datasets' bar
    prepare_rollouts(rollouts, flatten=True, progress=False)
    assert "flatten rollouts" not in capfd.readouterr().err
    assert datasets.is_progress_bar_enabled()  # as it was


@pytest.mark.parametrize("kind", ["json", "jsonl", "parquet", "disk"])
def test_task_rows_load_from_files_exactly(tokenizer, tmp_path, kind):
    env = GuessNumberEnv(tokenizer, {"low": 1, "high": 9, "max_turns": 2})
    rows = env.get_train_dataset(5)
    path = tmp_path / f"tasks.{kind}"
    if kind == "json":
        path.write_text(json.dumps(rows.to_list()))
    elif kind == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows.to_list()))
    elif kind == "parquet":
        rows.to_parquet(str(path))
    else:
        rows.save_to_disk(str(path))
    train, held = task_splits(tokenizer, tasks=path, eval_tasks=path, num_eval=3)
    assert train.to_list() == rows.to_list() and held.to_list() == rows.to_list()[:3]
    with pytest.raises(ValueError, match="needs env="):
        task_splits(tokenizer, num_train=2)


def test_an_empty_round_is_an_empty_step_everywhere(model_copy, caplog):
    """Issue 46, item 1: every group of the round has equal rewards (the number is always 3 and the random tiny model
    never says it), so nothing is kept; each piece takes the empty round as an empty step and the report says so."""
    model, tok = model_copy
    tasks = GuessNumberEnv(tok, {"low": 3, "high": 3, "max_turns": 2}).get_train_dataset(2)
    rollouts = collect_rollouts(tasks, TransformersAgent(model, tok, max_new_tokens=4, seed=0), 4, seed=0)
    prepared = prepare_rollouts(rollouts, flatten=True, drop_constant_groups=True, progress=False)
    report, rows = prepared.report, prepared.dataset
    assert report.constant_groups_dropped == 2 and report.rollouts_out == 0 and report.nothing_to_learn
    assert str(report).endswith("nothing to learn from in this round")
    assert len(rows) == 0 and rows.features == FLAT_FEATURES  # the full schema, not a dataset of no columns
    groups = prepare_rollouts(rollouts, drop_constant_groups=True, progress=False).dataset
    assert len(groups) == 0 and groups.column_names == [*rollouts.column_names, "advantages", "rollout_indices",
                                                        "advantage_mode"]  # fmt: skip
    control = shuffle_advantages(rows, seed=0)
    assert len(control) == 0 and control.features == FLAT_FEATURES
    with pytest.raises(ValueError, match="flatten=True"):
        shuffle_advantages(groups, seed=0)
    collate = RolloutCollator(tok.pad_token_id)
    batch = collate([])
    assert batch["input_ids"].shape == (0, 0) and batch["logprob_temperature"].shape == (0,)
    assert list(DataLoader(rows, batch_size=4, collate_fn=collate)) == []
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with caplog.at_level(logging.WARNING, logger="hf_rollouts.training"):
        m = grpo_update(model, optimizer, prepared, pad_token_id=tok.pad_token_id)
    assert m.steps == 0 and m.rollouts == 0 and math.isnan(m.loss) and not model.training
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "kept 0/2 groups (0%, below 25%)" in caplog.text and "nothing to learn from" in caplog.text


def test_grpo_update_warns_when_a_round_kept_few_of_its_groups_and_names_the_remedies(model_copy, tmp_path, caplog):
    """Issue 46, item 4: below ``UpdateConfig.warn_kept_groups`` (25% by default) of its groups kept, a round is
    mostly wasted; the warning says how many, why, and what usually helps."""
    few = RolloutFilterReport(groups_in=8, rollouts_in=32, constant_groups=6, constant_groups_dropped=6,
                              constant_group_rollouts_dropped=24, errors=4, errors_dropped=4, groups_out=1,
                              rollouts_out=4)  # fmt: skip
    text = few.low_signal_warning(0.25)
    assert "kept 1/8 groups (12%, below 25%): 6 had the same reward in every rollout" in text
    assert "1 lost every rollout to errors or truncation; few optimizer steps" in text
    for remedy in ("more rollouts per task", "higher sampling temperature", "harder", "easier"):
        assert remedy in text
    assert few.kept_group_fraction == 1 / 8 and few.low_signal_warning(0.1) is None and "\n" not in text
    assert RolloutFilterReport().low_signal_warning(0.5) is None  # no groups, nothing to say
    model, tok = model_copy
    rollouts, _ = _rollouts(model, tok, tmp_path)
    kept = prepare_rollouts(rollouts, flatten=True, progress=False)  # constant groups kept: every group kept
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with caplog.at_level(logging.WARNING, logger="hf_rollouts.training"):
        grpo_update(model, optimizer, kept, pad_token_id=tok.pad_token_id)
        grpo_update(model, optimizer, kept, pad_token_id=tok.pad_token_id, config=UpdateConfig(warn_kept_groups=1.0))
        assert not caplog.text
        dropped = dataclasses.replace(kept, report=dataclasses.replace(kept.report, groups_out=0, rollouts_out=0))
        grpo_update(model, optimizer, dropped, pad_token_id=tok.pad_token_id, config=UpdateConfig(warn_kept_groups=0))
        assert not caplog.text  # 0: never
        grpo_update(model, optimizer, dropped, pad_token_id=tok.pad_token_id)
    assert "grpo_update: the round kept 0/3 groups" in caplog.text
    with pytest.raises(ValueError, match="warn_kept_groups"):
        UpdateConfig(warn_kept_groups=25)
