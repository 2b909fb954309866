"""Overlapped training rounds (issue 51, item 1): the staleness math (training/staleness.py), the ``policy_versions``
column the round collector writes, and the overlapped loop (recipes/overlap.py) with the tiny model: max_staleness=0
is the synchronous loop exactly, max_staleness=1 collects round k+1 while update k runs (recorded timestamps), trains
on the previous version's rollouts with importance weights from their recorded log-probs, and drops (counted) what
is older than the bound."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys

import pytest
from datasets import load_from_disk

from hf_rollouts import training
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.publish.card import render_card
from hf_rollouts.recipes.overlap import fresh_enough, play_overlapped
from hf_rollouts.recipes.train import ROUND_STEPS, setup, train
from hf_rollouts.recipes.train_config import TrainConfig, TrainConfigError, check_config
from hf_rollouts.schema import ROLLOUT_FEATURES
from hf_rollouts.training import first_allowed_version, staleness_filter

# the toy task (guess 3, one turn): the random tiny model solves a few rollouts, so rounds 0 and 1 take steps
RUN = {"iterations": 3, "tasks_per_iter": 16, "num_rollouts": 8, "minibatch_size": 64, "eval_tasks": 4,
       "max_new_tokens": 3, "quiet": True, "plot": "none", "importance_sampling_cap": 2.0}  # fmt: skip
UNTIMED = ("seconds", "phases", "staleness")


def untimed(history) -> list[dict]:
    rows = []
    for s in history:
        row = {k: v for k, v in dataclasses.asdict(s).items() if k not in UNTIMED}
        if row["heldout"]:
            row["heldout"] = {k: v for k, v in row["heldout"].items() if k != "seconds"}
        rows.append(row)
    return rows


def run_overlapped(cfg: TrainConfig, max_staleness: int):
    with training.flush_denormals(True), contextlib.ExitStack() as cleanup:
        parts = setup(cfg, cleanup)
        timeline = play_overlapped(parts, ROUND_STEPS, max_staleness)
        return parts.history, timeline


def test_staleness_math():
    assert [first_allowed_version(r, 1) for r in range(4)] == [0, 0, 1, 2]
    assert [first_allowed_version(r, 0) for r in range(3)] == [0, 1, 2]
    report = staleness_filter([[2, 2], [1, 1], [0, 1], [2, 0]], trainer_version=2, max_staleness=1)
    assert report.keep == [True, True, False, False]
    assert (report.rollouts_in, report.rollouts_out, report.groups_dropped, report.rollouts_dropped) == (8, 4, 2, 4)
    assert report.staleness == {0: 3, 1: 3, 2: 2}
    assert report.as_metrics()["staleness"] == {"0": 3, "1": 3, "2": 2}
    assert staleness_filter([[0, 0]], 0, 0).keep == [True]
    with pytest.raises(ValueError, match=r"policy_versions\[0\]\[1\] is None"):
        staleness_filter([[0, None]], 1, 1)
    with pytest.raises(ValueError, match=r"policy_versions\[0\]\[0\] is 3"):
        staleness_filter([[3]], 2, 1)  # sampled by a version the trainer has not reached: a broken loop
    with pytest.raises(ValueError, match="max_staleness must be an int >= 0"):
        first_allowed_version(0, -1)


def test_options_are_checked_before_any_work():
    with pytest.raises(TrainConfigError, match="--importance-sampling-cap"):
        check_config(TrainConfig(max_staleness=1))
    for ok in ({"checkpoint_every": 1}, {"backend": "vllm"}, {"checkpoint_every": 1, "resume": True,
                                                                "output_dir": "out"}):  # fmt: skip
        check_config(TrainConfig(max_staleness=1, importance_sampling_cap=2.0, **ok))  # overlap runs with these
    with pytest.raises(TrainConfigError, match="--lora-rank with --backend vllm-server"):
        check_config(TrainConfig(backend="vllm-server", lora_rank=4))
    with pytest.raises(TrainConfigError, match=">= 0"):
        check_config(TrainConfig(max_staleness=-1))


def test_max_staleness_0_is_the_synchronous_loop_exactly(tmp_path):
    straight = train(TrainConfig(**RUN, output_dir=str(tmp_path / "sync")))
    switch = sys.getswitchinterval()
    lockstep, timeline = run_overlapped(TrainConfig(**RUN, output_dir=str(tmp_path / "zero")), 0)
    assert sys.getswitchinterval() == switch  # lowered while the rounds overlap (SWITCH_INTERVAL_S), restored
    assert sum(s.trained_rollouts for s in straight) > 0
    assert untimed(lockstep) == untimed(straight)
    assert [s.staleness["staleness"] for s in lockstep] == [{"0": 128}] * 3
    for k in (1, 2):  # lockstep: round k is collected after update k-1 ended
        assert timeline.collect[k][0] >= timeline.update[k - 1][1]


def test_max_staleness_1_overlaps_records_versions_and_weighs_by_the_recorded_logprobs(tmp_path):
    """Run in a fresh process (the body below). In the suite's own process an earlier test builds a TRL
    ``GRPOTrainer`` (tests/test_dataset_env.py), whose ``GRPOConfig`` defaults to bf16: accelerate's process-wide
    state then holds ``mixed_precision="bf16"`` and every later ``Accelerator()`` inherits it, so the run trained and
    sampled under bf16 autocast and round 1's log-probs were 2.9e-3 off the float32 recompute (found by bisection:
    that test alone before this one reproduces it)."""
    if os.environ.get(CHILD) == "1":
        return _max_staleness_1(tmp_path)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{__file__}::test_max_staleness_1_overlaps_records_versions_and_weighs_by_the_recorded_logprobs"],
                         env={**os.environ, CHILD: "1"}, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout


CHILD = "HF_ROLLOUTS_OVERLAP_TEST_CHILD"


def _max_staleness_1(tmp_path):
    cfg = TrainConfig(**RUN, max_staleness=1, keep_rollouts=True, output_dir=str(tmp_path / "one"))
    history, timeline = run_overlapped(cfg, 1)
    for k in (1, 2):  # round k's collection began before update k-1 ended
        assert timeline.collect[k][0] < timeline.update[k - 1][1]
    assert [(s.staleness["policy_version"], s.staleness["trainer_version"]) for s in history] == [(0, 0), (0, 1),
                                                                                               (1, 2)]  # fmt: skip
    assert [s.staleness["rollouts_dropped"] for s in history] == [0, 0, 0]
    round1 = load_from_disk(str(tmp_path / "one" / "rollouts" / "iter0001"))
    assert round1.features["policy_versions"] == ROLLOUT_FEATURES["policy_versions"]
    assert {v for row in round1["policy_versions"] for v in row} == {0}
    card = str(render_card(round1, agent_info={"name": "tiny"}, seed=0, pad_token_id=0))
    assert "policy_versions" in card and "the policy version that sampled it" in card  # on the card, with its help
    # the recorded log-probs of round 1 are version 0's (the starting weights, rebuilt): no gap against them ...
    start = load_agent("tiny", model_seed=cfg.seed).model
    rows = training.prepare_rollouts(round1, flatten=True, progress=False).dataset
    assert training.logprob_gap(start, rows, 0).max_abs < 1e-4
    # ... and the update weighed them against the trainer at version 1: a gap, weights away from 1
    assert history[0].trained_rollouts and history[1].trained_rollouts
    assert history[1].logprob_gap["max_abs"] > 1e-3 and history[1].importance["mean"] != pytest.approx(1.0, abs=1e-4)
    assert history[0].logprob_gap["max_abs"] < 1e-4  # round 0: sampled by the trainer's own version


def test_rollouts_older_than_the_bound_are_dropped_and_counted(tmp_path, capsys):
    cfg = TrainConfig(**{**RUN, "iterations": 1}, keep_rollouts=True, output_dir=str(tmp_path / "r"))
    run_overlapped(cfg, 1)
    rollouts = load_from_disk(str(tmp_path / "r" / "rollouts" / "iter0000"))  # sampled by version 0
    versions = [[0] * len(r) for r in rollouts["final_rewards"]]
    versions[0] = [2] * len(versions[0])  # one group of version 2
    rollouts = rollouts.remove_columns("policy_versions").add_column(
        "policy_versions", versions, feature=ROLLOUT_FEATURES["policy_versions"]
    )
    kept, metrics = fresh_enough(rollouts, trainer_version=2, max_staleness=1)
    assert len(kept) == 1 and kept["policy_versions"][0][0] == 2
    assert metrics["groups_dropped"] == len(rollouts) - 1
    assert metrics["rollouts_dropped"] == 8 * (len(rollouts) - 1)
    assert "dropped" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="every group of the round is older"):
        fresh_enough(rollouts.select(range(1, 3)), trainer_version=2, max_staleness=1)


def test_hf_rollouts_train_takes_max_staleness_and_writes_the_staleness_metrics(tmp_path):
    import json

    import yaml

    from hf_rollouts.cli import main as cli

    out, config = tmp_path / "cli", tmp_path / "run.yaml"
    values = {"iterations": 2, "tasks_per_iter": 8, "num_rollouts": 4, "eval_tasks": 0, "max_new_tokens": 3,
              "quiet": True, "plot": "none", "output_dir": str(out)}  # fmt: skip
    config.write_text(yaml.safe_dump(values))
    args = ["train", str(config)]
    assert cli([*args, "--max-staleness", "1"]) == 2  # refused before any work: no --importance-sampling-cap
    assert not out.exists()
    assert cli([*args, "--max-staleness", "1", "--importance-sampling-cap", "2.0"]) == 0
    rows = json.loads((out / "metrics.json").read_text())
    assert [(r["staleness"]["policy_version"], r["staleness"]["trainer_version"]) for r in rows] == [(0, 0), (0, 1)]


def test_the_waiting_env_waits_in_an_async_step_and_plays_guess_the_number():
    import asyncio
    import inspect
    import time

    from hf_rollouts.envs.guess_number import GuessNumberEnv, WaitingGuessNumberEnv

    tokenizer = load_agent("tiny").tokenizer
    waiting = WaitingGuessNumberEnv(tokenizer, {"step_wait_s": 0.05})
    plain = GuessNumberEnv(tokenizer, {})
    assert inspect.iscoroutinefunction(waiting._step_episode)
    began = time.perf_counter()
    got = asyncio.run(waiting._step_episode("s", waiting._initialize_episode("s", {"target": 4}), "3"))
    assert time.perf_counter() - began >= 0.05  # it waited (a lower bound, not a speed threshold)
    want = plain._step_episode("s", plain._initialize_episode("s", {"target": 4}), "3")
    assert got[1:] == want[1:] and got[0].last_message == want[0].last_message == "Higher."
    with pytest.raises(Exception, match="step_wait_s"):
        WaitingGuessNumberEnv(tokenizer, {"step_wait_s": -1})


def test_an_overlapped_run_killed_after_a_checkpoint_resumes_to_the_straight_runs_metrics_and_weights(tmp_path):
    """Issue 51, items 1 and 6 together: an overlapped run (``--max-staleness 1``) SIGKILLed as soon as round 1's
    checkpoint is complete (round 2 is then being collected, or trained), resumed, ends with the straight overlapped
    run's metrics and weights bit for bit. Round 1's checkpoint holds the collector's version 1 (what round 2 is
    sampled by) beside the trainer's version 2; the resumed collector samples round 2 again with it. Both runs in
    subprocesses (see the test above, and tests/test_train_command.py)."""
    import json

    import torch
    from safetensors.torch import load_file
    from test_train_command import ROOT, final_weights, same_json, sigkill_after_checkpoint, untimed, write_yaml

    values = {**RUN, "iterations": 4, "eval_every": 2, "checkpoint_every": 1, "keep_checkpoints": 4,
              "max_staleness": 1}  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "hf_rollouts.cli", "train"]
    out = tmp_path / "straight"
    subprocess.run([*command, str(write_yaml(tmp_path / "straight.yaml", {**values, "output_dir": str(out)}))],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    rows = json.loads((out / "metrics.json").read_text())
    assert [(r["staleness"]["policy_version"], r["iteration"]) for r in rows] == [(0, 0), (0, 1), (1, 2), (2, 3)]
    assert all(r["trained_rollouts"] for r in rows[:2])
    saved = out / "checkpoints" / "round-0001"
    assert json.loads((saved / "state.json").read_text())["sampler_versions"] == [1]
    version1 = load_file(str(saved / "sampler" / "version-000001.safetensors"))  # what trained round 1 = version 1
    before = load_file(str(out / "checkpoints" / "round-0000" / "model.safetensors"))
    assert all(torch.equal(version1[k], before[k]) for k in before)
    run = tmp_path / "run"
    cfg = write_yaml(tmp_path / "run.yaml", {**values, "output_dir": str(run)})
    sigkill_after_checkpoint([*command, str(cfg)], run, env)
    resumed = subprocess.run([*command, str(cfg), "--resume", "--quiet", "false"], cwd=ROOT, env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from " in resumed.stdout and "is torn" not in resumed.stderr
    assert same_json(untimed(json.loads((run / "metrics.json").read_text())), untimed(rows))
    a, b = final_weights(out), final_weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)
