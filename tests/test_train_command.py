"""``hf-rollouts train CONFIG`` (issue 51, items 7 and 6): the config file (YAML and TOML, flags over the file, unknown
keys and wrong types named with the file), ``--dry-run`` (config, task rows with the trust rule, model, memory plan),
and exact resume: a run stopped or really killed (SIGKILL) after a checkpoint, resumed, ends with the straight run's
metrics and weights, bit for bit on CPU; a torn checkpoint is skipped for the one before it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_rollouts.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
# the toy task (guess 3, one turn) at the script's round size: the random tiny model solves a few rollouts of round 0,
# so every round takes optimizer steps (resume must restore AdamW's state to match)
RUN = {"iterations": 4, "tasks_per_iter": 32, "num_rollouts": 8, "minibatch_size": 64, "eval_tasks": 4,
       "eval_every": 2, "max_new_tokens": 3, "quiet": True, "plot": "none", "checkpoint_every": 1}  # fmt: skip
TIMINGS = ("seconds", "phases")


def write_yaml(path: Path, values: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values))
    return path


def sigkill_after_checkpoint(command: list[str], run: Path, env: dict, within_s: float = 240) -> None:
    """Start ``command`` (a ``train`` of OUTPUT_DIR ``run``) and SIGKILL it as soon as round 1's checkpoint is
    complete (its manifest is written last), wherever the run is then; fails if it ends or takes over ``within_s``."""
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + within_s
    try:
        while not (run / "checkpoints" / "round-0001" / "manifest.json").is_file():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, f"no checkpoint of round 1 within {within_s:.0f} s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def untimed(rows: list[dict]) -> list[dict]:
    """metrics.json rows without what a clock measured (round and phase seconds, the evaluation's seconds)."""
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k not in TIMINGS}
        if row.get("heldout"):
            row["heldout"] = {k: v for k, v in row["heldout"].items() if k != "seconds"}
        out.append(row)
    return out


def same_json(a, b) -> bool:
    """Equal, NaN equal to NaN (json.dumps writes both as NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    last = sorted((out / "checkpoints").glob("round-*"))[-1]
    return load_file(str(last / "model.safetensors"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 4-round run (checkpoints every round)."""
    out = tmp_path_factory.mktemp("straight")
    cfg = write_yaml(out / "run.yaml", {**RUN, "output_dir": str(out / "run")})
    assert cli(["train", str(cfg)]) == 0
    rows = json.loads((out / "run" / "metrics.json").read_text())
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert sum(r["trained_rollouts"] for r in rows) > 0 and all(r["fingerprint_changed"] for r in rows[1:])
    return out / "run", rows


def test_flags_override_the_file_and_yaml_and_toml_read_alike(tmp_path):
    from hf_rollouts.cli_train import parse_train_args

    yaml_file = write_yaml(tmp_path / "a.yaml", {"lr": 0.5, "tasks-per-iter": 3, "env": "arithmetic", "quiet": True})
    toml_file = tmp_path / "a.toml"
    toml_file.write_text('lr = 0.5\ntasks_per_iter = 3\nenv = "arithmetic"\nquiet = true\n')
    for path in (yaml_file, toml_file):
        cfg, args = parse_train_args([str(path)])
        assert (cfg.lr, cfg.tasks_per_iter, cfg.env, cfg.quiet, args.dry_run) == (0.5, 3, "arithmetic", True, False)
        cfg, args = parse_train_args(["--lr", "0.25", str(path), "--dry-run", "--quiet", "false"])
        assert (cfg.lr, cfg.tasks_per_iter, cfg.quiet, args.dry_run) == (0.25, 3, False, True)  # the flags win
        assert cfg.num_rollouts == 8  # not in the file: the default


def test_an_unknown_key_or_a_wrong_type_is_an_error_naming_the_key_and_the_file(tmp_path, capsys):
    bad = write_yaml(tmp_path / "bad.yaml", {"lr": 0.1, "tasks_per_iteration": 4})
    assert cli(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: unknown key 'tasks_per_iteration'" in err and "did you mean 'tasks_per_iter'" in err
    wrong = write_yaml(tmp_path / "wrong.yaml", {"num_rollouts": "eight"})
    assert cli(["train", str(wrong)]) == 2
    assert f"{wrong}: num_rollouts must be <class 'int'>, got 'eight'" in capsys.readouterr().err
    odd = tmp_path / "run.json"
    odd.write_text("{}")
    assert cli(["train", str(odd)]) == 2 and "ends in .yaml, .yml or .toml" in capsys.readouterr().err
    clash = write_yaml(tmp_path / "clash.yaml", {"lora_rank": 4, "trainable_layers": 1})
    assert cli(["train", str(clash)]) == 2 and "leave --trainable-layers at 0" in capsys.readouterr().err
    early = write_yaml(tmp_path / "early.yaml", {"checkpoint_every": 2, "stop_after_round": 2})  # no checkpoint at 2
    assert cli(["train", str(early)]) == 2 and "N dividing R + 1" in capsys.readouterr().err


def test_dry_run_prints_the_plan_and_does_no_work(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = write_yaml(tmp_path / "run.yaml", {**RUN, "output_dir": str(out), "lora_rank": 4})
    assert cli(["train", str(cfg), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "4 rounds x 32 tasks x 8 rollouts = 1024 episodes" in plan
    assert "128 train rows, 4 held-out rows; env classes checked: hf_rollouts.envs.guess_number" in plan
    assert "trains 0." in plan and "(LoRA rank 4)" in plan and "AdamW" in plan and "KV cache" in plan
    assert plan.rstrip().endswith("the run can start") and not out.exists()  # nothing written, nothing trained

    from hf_rollouts.recipes.plan import memory_plan
    from hf_rollouts.recipes.train_config import TrainConfig
    from hf_rollouts.tiny_model import build_tiny_model

    model, _ = build_tiny_model()
    full, lora = memory_plan(model, TrainConfig()), memory_plan(model, TrainConfig(lora_rank=4))
    n = sum(p.numel() for p in model.parameters())
    assert full.weights == full.grads == 4 * n and full.optimizer == 8 * n  # float32: grads + two AdamW states
    linear = sum(4 * (m.in_features + m.out_features) for m in model.modules()
                 if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings())  # fmt: skip
    assert lora.adapter == lora.grads == 4 * linear and lora.weights == full.weights


def test_dry_run_refuses_untrusted_task_rows_and_a_model_it_cannot_load(tmp_path, capsys):
    from datasets import Dataset

    rows = [{"env_class_path": "os.system", "env_config": "{}", "task_data": "{}"}]
    Dataset.from_list(rows).to_json(str(tmp_path / "tasks.jsonl"))
    cfg = write_yaml(tmp_path / "run.yaml", {"tasks": str(tmp_path / "tasks.jsonl"), "iterations": 1})
    assert cli(["train", str(cfg), "--dry-run"]) == 2
    plan = capsys.readouterr().out
    assert "the run cannot start" in plan and "task rows: TaskValidationError" in plan and "os.system" in plan
    assert cli(["train", str(cfg), "--dry-run", "--model", str(tmp_path / "no_model")]) == 2
    assert "cannot load: ModelNotFoundError" in capsys.readouterr().out


def test_a_stopped_run_resumes_to_the_straight_runs_metrics_and_weights_bit_for_bit(straight, tmp_path):
    out, rows = straight
    cfg = write_yaml(tmp_path / "run.yaml", {**RUN, "output_dir": str(tmp_path / "run")})
    assert cli(["train", str(cfg), "--stop-after-round", "1"]) == 0  # two rounds, then stops at the checkpoint
    assert [p.name for p in sorted((tmp_path / "run" / "checkpoints").iterdir())] == ["round-0000", "round-0001"]
    assert cli(["train", str(cfg), "--resume"]) == 0
    resumed = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert same_json(untimed(resumed), untimed(rows))
    a, b = final_weights(out), final_weights(tmp_path / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ours = json.loads((sorted((tmp_path / "run" / "checkpoints").glob("round-*"))[-1] / "state.json").read_text())
    assert ours["round"] == 3 and ours["data_position"] == 0  # 4 x 32 rows of 128: wrapped to the start


def test_a_torn_checkpoint_is_skipped_with_a_warning_and_the_previous_one_used(straight, tmp_path, capsys):
    from hf_rollouts.recipes.checkpoint import TornCheckpointWarning

    _, rows = straight
    cfg = write_yaml(tmp_path / "run.yaml", {**RUN, "output_dir": str(tmp_path / "run"), "keep_checkpoints": 3})
    assert cli(["train", str(cfg), "--stop-after-round", "2"]) == 0
    (tmp_path / "run" / "checkpoints" / "round-0002" / "optimizer.pt").unlink()
    with pytest.warns(TornCheckpointWarning, match=r"round-0002 is torn: optimizer.pt is missing"):
        assert cli(["train", str(cfg), "--resume", "--quiet", "false"]) == 0
    assert "resumed from " in capsys.readouterr().out
    assert same_json(untimed(json.loads((tmp_path / "run" / "metrics.json").read_text())), untimed(rows))


def test_resume_refuses_other_options_and_a_missing_checkpoint(tmp_path, capsys):
    cfg = write_yaml(tmp_path / "run.yaml", {**RUN, "iterations": 2, "tasks_per_iter": 2, "num_rollouts": 2,
                                             "output_dir": str(tmp_path / "run")})  # fmt: skip
    assert cli(["train", str(cfg), "--resume"]) == 2
    assert "no complete checkpoint under" in capsys.readouterr().err
    assert cli(["train", str(cfg), "--stop-after-round", "0"]) == 0
    assert cli(["train", str(cfg), "--resume", "--lr", "0.5"]) == 2
    assert "is of another run (lr: 0.01 in the checkpoint, 0.5 now)" in capsys.readouterr().err


def test_a_run_killed_with_sigkill_resumes_to_the_straight_runs_metrics(tmp_path):
    """A real kill: the command in a subprocess, SIGKILLed as soon as round 1's checkpoint is complete (wherever it
    is then: round 2's rollouts, its update or its checkpoint being written), then resumed. The straight run it is
    compared with runs in a subprocess too: this test process's torch thread count is whatever earlier tests left,
    and another count sums in another order (bits differ)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "straight"
    subprocess.run([sys.executable, "-m", "hf_rollouts.cli", "train",
                    str(write_yaml(tmp_path / "straight.yaml", {**RUN, "output_dir": str(out)}))],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    rows = json.loads((out / "metrics.json").read_text())
    run = tmp_path / "run"
    cfg = write_yaml(tmp_path / "run.yaml", {**RUN, "output_dir": str(run)})
    sigkill_after_checkpoint([sys.executable, "-m", "hf_rollouts.cli", "train", str(cfg)], run, env)
    resumed = subprocess.run([sys.executable, "-m", "hf_rollouts.cli", "train", str(cfg), "--resume"], cwd=ROOT,
                             env=env, capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # a kill leaves no torn checkpoint, at most a .tmp
    assert "is torn" not in resumed.stderr and "TornCheckpointWarning" not in resumed.stderr
    assert same_json(untimed(json.loads((run / "metrics.json").read_text())), untimed(rows))
    a, b = final_weights(out), final_weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not list((run / "checkpoints").glob(".*.tmp"))  # a killed save's temporary folder is removed


# --------------------------------------------------------------------------- LoRA (issue 51, item 4)
LORA = {**RUN, "iterations": 3, "eval_every": 0, "lora_rank": 4, "lr": 0.05}


def test_lora_trains_the_adapter_alone_checkpoints_it_and_resumes_exactly(tmp_path):
    pytest.importorskip("peft")
    from hf_rollouts.tiny_model import build_tiny_model

    straight = write_yaml(tmp_path / "lora.yaml", {**LORA, "output_dir": str(tmp_path / "straight")})
    assert cli(["train", str(straight)]) == 0
    rows = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert sum(r["trained_rollouts"] for r in rows) > 0  # updates happened
    last = sorted((tmp_path / "straight" / "checkpoints").glob("round-*"))[-1]
    assert not (last / "model.safetensors").exists() and (last / "adapter" / "adapter_config.json").is_file()
    adapter = load_file(str(last / "adapter" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0: it was trained
    base, _ = build_tiny_model()  # the same seed: the weights LoRA runs on
    n_base = sum(p.numel() for p in base.parameters())
    assert 0 < sum(v.numel() for v in adapter.values()) < n_base / 2

    resumed = write_yaml(tmp_path / "lora2.yaml", {**LORA, "output_dir": str(tmp_path / "resumed")})
    assert cli(["train", str(resumed), "--stop-after-round", "0"]) == 0
    assert cli(["train", str(resumed), "--resume"]) == 0
    assert same_json(untimed(json.loads((tmp_path / "resumed" / "metrics.json").read_text())), untimed(rows))
    again = sorted((tmp_path / "resumed" / "checkpoints").glob("round-*"))[-1]
    other = load_file(str(again / "adapter" / "adapter_model.safetensors"))
    assert all(torch.equal(adapter[k], other[k]) for k in adapter)


def test_lora_leaves_the_base_weights_and_samples_with_the_adapter(tmp_path):
    pytest.importorskip("peft")
    from hf_rollouts.agents.hf.agent import weights_probe
    from hf_rollouts.recipes import train as run
    from hf_rollouts.recipes.train_config import TrainConfig

    cfg = TrainConfig(**{**LORA, "iterations": 1, "checkpoint_every": 0, "output_dir": str(tmp_path)})
    import contextlib

    with contextlib.ExitStack() as cleanup:
        parts = run.setup(cfg, cleanup)
        before = {k: v.clone() for k, v in parts.model.state_dict().items() if "lora_" not in k}
        probe = parts.agent.weights_probe()
        stats = run.play_round(parts, 0)
    assert stats.trained_rollouts and stats.fingerprint_changed
    after = parts.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the base weights never move
    assert parts.agent.model is parts.model and probe != parts.agent.weights_probe() == weights_probe(parts.model)
    assert {p for p in parts.raw_optimizer.param_groups[0]["params"]} == {
        p for n, p in parts.model.named_parameters() if "lora_" in n
    }


def test_lora_with_vllm_is_accepted_and_its_engine_serves_the_rank():
    """``--lora-rank`` with ``--backend vllm`` passes the checks (the engine serves the adapter:
    tests/test_vllm_lora.py runs it); the engine's ``max_lora_rank`` is the smallest rank vLLM accepts that holds it,
    and a rank vLLM cannot serve is refused before any work."""
    from hf_rollouts.agents.vllm import lora_engine_kwargs
    from hf_rollouts.recipes.train_config import TrainConfig, TrainConfigError, check_config

    check_config(TrainConfig(lora_rank=4, backend="vllm"))
    assert lora_engine_kwargs(4) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1, "max_cpu_loras": 2}
    assert [lora_engine_kwargs(r)["max_lora_rank"] for r in (1, 8, 9, 300, 512)] == [1, 8, 16, 320, 512]
    with pytest.raises(TrainConfigError, match="up to 512"):
        check_config(TrainConfig(lora_rank=600, backend="vllm"))
    with pytest.raises(ValueError, match="ranks 1..512"):
        lora_engine_kwargs(0)
    with pytest.raises(TrainConfigError, match="overlapped collector loads whole weights"):
        check_config(TrainConfig(lora_rank=4, backend="vllm", max_staleness=1, importance_sampling_cap=2.0))
    check_config(TrainConfig(lora_rank=4, max_staleness=1, importance_sampling_cap=2.0))  # transformers: one model


# --------------------------------------------------------------------------- trackio (issue 51, item 5)
def test_report_to_trackio_logs_each_round_and_a_rollout_table_that_trackio_reads_back(tmp_path):
    """The real trackio, offline, in subprocesses (it reads TRACKIO_DIR once, when imported): the run logs to
    OUTPUT_DIR/trackio; trackio's own storage reads the rounds back; `hf-rollouts view` opens a round's rollouts."""
    pytest.importorskip("trackio")
    out = tmp_path / "run"
    values = {**RUN, "iterations": 2, "tasks_per_iter": 16, "checkpoint_every": 0, "eval_every": 1, "log_rollouts": 3,
              "importance_sampling_cap": 2.0, "keep_rollouts": True, "report_to": "trackio"}  # fmt: skip
    cfg = write_yaml(tmp_path / "run.yaml", {**values, "output_dir": str(out)})
    env = {k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "hf_rollouts.cli", "train", str(cfg)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "trackio" / "hf_rollouts.db").is_file()
    read = ("import json; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps(S.get_logs('hf_rollouts', 'run'), default=str))")  # fmt: skip
    got = subprocess.run([sys.executable, "-c", read], env={**env, "TRACKIO_DIR": str(out / "trackio")},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr[-3000:]
    logs = {row["step"]: row for row in json.loads(got.stdout.strip().splitlines()[-1])}
    rows = json.loads((out / "metrics.json").read_text())
    assert sorted(logs) == [0, 1, 2]  # the base rate, then a step per round
    assert logs[0]["heldout/success"] == json.loads((out / "summary.json").read_text())["heldout_before"]["success"]
    for row in rows:
        logged = logs[row["iteration"] + 1]
        assert logged["reward/mean"] == pytest.approx(row["mean_reward"])
        assert logged["solve_rate"] == pytest.approx(row["solve_rate"])
        assert logged["groups/kept"] == row["groups"]["kept"] and logged["groups/total"] == 16
        assert logged["time/collect"] == pytest.approx(row["phases"]["collect"])
        assert logged["tokens_per_second"] == pytest.approx(row["agent_tokens"] / row["phases"]["collect"])
        assert logged["heldout/success"] == pytest.approx(row["heldout"]["success"])
        if row["importance"]:  # a round that took a step: the importance weights and the update's log-prob gap
            assert logged["importance_weight/mean"] == pytest.approx(row["importance"]["mean"])
            assert logged["logprob_gap/max_abs"] == pytest.approx(row["logprob_gap"]["max_abs"])
        table = logged["rollouts"]
        assert table["_type"] == "trackio.table" and len(table["_value"]) == 3
        assert {"task", "status", "final_reward", "conversation"} <= set(table["_value"][0])
        assert table["_value"][0]["conversation"].startswith("user: Guess the number")
    assert any(r["importance"] for r in rows)

    page = tmp_path / "round1.html"
    assert cli(["view", str(out / "rollouts" / "iter0001"), "--html", str(page)]) == 0
    assert "Guess the number" in page.read_text()
    from hf_rollouts.viewer.source import open_rollouts

    assert open_rollouts(str(out / "rollouts" / "iter0001")).tokenizer is not None  # the round's saved tokenizer


def test_round_metrics_flatten_a_round_and_leave_nan_out():
    from hf_rollouts.recipes.runs import IterationStats
    from hf_rollouts.recipes.tracking import round_metrics

    s = IterationStats(0, 0.5, 0.25, float("nan"), 0, 8, 1, float("nan"), float("nan"), float("nan"), False, 2.0,
                       phases={"collect": 0.5, "update": 1.0}, groups={"total": 2, "kept": 0, "constant": 2},
                       agent_tokens=40, logprob_gap={"tokens": 3, "max_abs": 0.1, "mean_abs": 0.05})  # fmt: skip
    m = round_metrics(s)
    assert m["reward/mean"] == 0.5 and m["tokens_per_second"] == 80.0 and m["groups/constant"] == 2.0
    assert "loss" not in m and "grad_norm" not in m and m["logprob_gap/max_abs"] == 0.1 and m["time/update"] == 1.0


def test_rng_states_round_trip():
    import random

    import numpy as np

    from hf_rollouts.recipes.checkpoint import rng_state, set_rng_state

    state = rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(json.loads(json.dumps(state)))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], again[0]) and (first[1] == again[1]).all() and first[2] == again[2]


def test_the_guides_config_file_parses_and_plans(tmp_path):
    """docs/guides/training.md's config file: every key an option, the values the guide's SmolLM2 run's flags."""
    from hf_rollouts.cli_train import parse_train_args
    from hf_rollouts.recipes.train_config import check_config

    guide = (ROOT / "docs" / "guides" / "training.md").read_text()
    block = guide.split("test_the_guides_config_file_parses_and_plans -->\n```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "arith.yaml"
    path.write_text(block)
    cfg, args = parse_train_args([str(path), "--dry-run"])
    check_config(cfg)
    assert (cfg.model, cfg.env, cfg.lr, cfg.trainable_layers, cfg.report_to) == ("smollm2", "arithmetic", 3e-5, 10,
                                                                                "trackio")  # fmt: skip
    assert cfg.checkpoint_every == 1 and cfg.keep_rollouts and args.dry_run


def test_the_eval_phase_is_timed_only_where_held_out_rows_were_played(tmp_path):
    cfg = {**RUN, "iterations": 2, "tasks_per_iter": 2, "num_rollouts": 2, "checkpoint_every": 0, "eval_every": 1}
    for eval_tasks, phases in ((0, {"collect", "update"}), (2, {"collect", "update", "eval"})):
        out = tmp_path / str(eval_tasks)
        path = write_yaml(tmp_path / f"{eval_tasks}.yaml", {**cfg, "eval_tasks": eval_tasks, "output_dir": str(out)})
        assert cli(["train", str(path)]) == 0
        rows = json.loads((out / "metrics.json").read_text())
        assert all(set(r["phases"]) == phases for r in rows)  # tests/test_vllm_training.py reads the phases too


INHERITED = """
import sys, warnings
from accelerate import Accelerator
Accelerator(mixed_precision="bf16", cpu=True)  # what a TRL GRPOTrainer built earlier leaves (GRPOConfig: bf16)
from hf_rollouts.cli import main
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    code = main(["train", sys.argv[1]])
print("WARNED" if any("already holds mixed_precision='bf16'" in str(w.message) for w in seen) else "SILENT", code)
"""


def test_a_run_that_inherits_another_librarys_mixed_precision_says_so(tmp_path):
    """accelerate's state is process-wide: after a TRL trainer (bf16 by default) a later Accelerator() autocasts in
    bf16. Found in this suite: the overlapped-rounds test's log-probs were 2.9e-3 off after tests/test_dataset_env.py's
    GRPOTrainer. In a fresh process (no inherited state) the same run warns of nothing."""
    cfg = write_yaml(tmp_path / "one.yaml", {**RUN, "iterations": 1, "eval_tasks": 0, "checkpoint_every": 0,
                                             "output_dir": str(tmp_path / "out")})  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_MIXED_PRECISION"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", INHERITED, str(cfg)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.stdout.split()[-2:] == ["WARNED", "0"], run.stderr[-2000:]
    fresh = INHERITED.replace('Accelerator(mixed_precision="bf16", cpu=True)', "")
    run = subprocess.run([sys.executable, "-c", fresh, str(cfg)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.stdout.split()[-2:] == ["SILENT", "0"], run.stderr[-2000:]
