"""The training scripts' real-model paths, on the tiny model (the long SmolLM2 runs are scripts, not tests):
held-out evaluation, the shuffled-reward control, training only the top layers, summary.json, and tool output
kept out of the loss."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def grpo():
    yield _script("train_grpo")
    sys.modules.pop("train_grpo", None)


@pytest.fixture(scope="module")
def trl_script():
    pytest.importorskip("trl")
    yield _script("train_trl")
    sys.modules.pop("train_trl", None)


def test_shuffle_control_permutes_advantages_within_each_group_only():
    from datasets import Dataset

    from hf_rollouts.training import shuffle_advantages

    rows = Dataset.from_dict({"group_id": [0, 0, 0, 0, 1, 1, 1, 1], "advantage": [1.0, 2, 3, 4, 10, 20, 30, 40]})
    out = [shuffle_advantages(rows, seed) for seed in range(5)]
    for ds in out:
        adv = ds["advantage"]
        assert sorted(adv[:4]) == [1, 2, 3, 4] and sorted(adv[4:]) == [10, 20, 30, 40]
    assert any(ds["advantage"] != rows["advantage"] for ds in out)  # it does move them
    assert shuffle_advantages(rows, 3)["advantage"] == out[3]["advantage"]  # seeded


def test_shuffled_reward_keeps_each_groups_rewards_and_breaks_the_link():
    from hf_rollouts.integrations.trl import shuffled_env_reward

    reward = shuffled_env_reward(num_generations=4, seed=0)
    finals = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0] * 4
    statuses = ["done"] * 32
    runs = [reward([None] * 32, [None] * 32, env_final_reward=finals, env_status=statuses) for _ in range(3)]
    for got in runs:
        for g in range(0, 32, 4):
            assert sorted(got[g : g + 4]) == sorted(finals[g : g + 4])
    assert any(got != finals for got in runs)


def test_train_top_layers_freezes_the_rest_and_the_gradient_stops_there(tiny):
    from hf_rollouts.training import token_logprobs, train_top_layers

    model, tok = tiny
    layers = model.base_model.layers
    model.zero_grad(set_to_none=True)
    try:
        params = train_top_layers(model, 1)
        top = {id(p) for p in [*layers[-1].parameters(), *model.base_model.norm.parameters()]}
        assert {id(p) for p in params} == top
        ids = torch.tensor([tok("a b c d", add_special_tokens=False)["input_ids"]])
        token_logprobs(model, ids).sum().backward()
        assert all(p.grad is not None for p in params)
        assert all(p.grad is None for p in model.parameters() if id(p) not in top)
        with pytest.raises(ValueError, match="num_layers must be in 1"):
            train_top_layers(model, len(layers) + 1)
    finally:
        model.requires_grad_(True)
        model.zero_grad(set_to_none=True)


def test_train_grpo_on_a_real_model_path_writes_the_held_out_summary(grpo, tmp_path):
    """The path `--model smollm2 --env arithmetic --eval-tasks ... --control shuffle --trainable-layers` takes, on the
    tiny model: a few steps, evaluations before, during and after on the same held-out rows."""
    out = tmp_path / "run"
    argv = [
        *("--env", "arithmetic", "--iterations", "2", "--tasks-per-iter", "2", "--num-rollouts", "4"),
        *("--eval-tasks", "6", "--eval-every", "1", "--max-new-tokens", "3", "--trainable-layers", "1"),
        *("--control", "shuffle", "--keep-constant-groups", "--share-prefix", "--quiet"),
        *("--output-dir", str(out), "--plot", "none"),
    ]
    cfg = grpo.parse_args(argv)
    history = grpo.train(cfg, command="python scripts/train_grpo.py " + " ".join(argv))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["command"].endswith("--plot none") and summary["config"]["control"] == "shuffle"
    before, after = summary["heldout_before"], summary["heldout_after"]
    assert before["episodes"] == after["episodes"] == 6 and before["low"] <= before["success"] <= before["high"]
    assert [p["iteration"] for p in summary["heldout_curve"]] == [0, 1] and after == history[-1].heldout
    assert summary["cpu_seconds"] > 0 and summary["wall_seconds"] > 0
    assert len(json.loads((out / "metrics.json").read_text())) == 2
    # --iterations 0: the held-out evaluation alone, a base rate
    only = grpo.parse_args(
        [*argv[:2], "--iterations", "0", "--eval-tasks", "6", "--output-dir", str(tmp_path / "base")]
    )
    assert grpo.train(only) == []
    base = json.loads((tmp_path / "base" / "summary.json").read_text())
    assert base["heldout_before"] == base["heldout_after"] and base["heldout_before"]["episodes"] == 6


def test_train_grpo_warns_of_a_round_with_nothing_to_learn_from_and_goes_on(grpo, tmp_path, caplog):
    """Issue 46, items 1 and 4: the random tiny model never answers the arithmetic questions, so every group is
    constant and dropped; the round (with the shuffle control too) is an empty step and the warning says why."""
    argv = [
        *("--env", "arithmetic", "--iterations", "1", "--tasks-per-iter", "2", "--num-rollouts", "2"),
        *("--max-new-tokens", "2", "--control", "shuffle", "--quiet", "--plot", "none", "--output-dir", str(tmp_path)),
    ]
    with caplog.at_level(logging.WARNING, logger="hf_rollouts.training"):
        (stats,) = grpo.train(grpo.parse_args(argv))
    assert stats.trained_rollouts == 0 and stats.mean_reward == 0
    assert "kept 0/2 groups" in caplog.text and "more rollouts per task" in caplog.text


def test_train_trl_on_a_real_model_path_writes_the_held_out_summary(trl_script, tmp_path):
    out = tmp_path / "trl"
    argv = [
        *("--env", "arithmetic", "--max-steps", "4", "--steps-per-generation", "2"),
        *("--tasks-per-step", "2", "--num-generations", "4"),
        *("--eval-tasks", "6", "--max-new-tokens", "3", "--trainable-layers", "1", "--control", "shuffle"),
        *("--quiet", "--output-dir", str(out)),
    ]
    rows = trl_script.train(trl_script.parse_args(argv), command="python scripts/train_trl.py")
    summary = json.loads((out / "summary.json").read_text())
    assert len(rows) == 2 and [r["step"] for r in summary["steps"]] == [1, 2]  # rounds: a rollout call each
    assert [r["optimizer_step"] for r in summary["steps"]] == [1, 3]  # two optimizer steps per round
    assert summary["heldout_before"]["episodes"] == summary["heldout_after"]["episodes"] == 6
    assert summary["config"]["trainable_layers"] == 1 and summary["cpu_seconds"] > 0


def test_tool_output_is_never_in_the_loss_of_a_calculator_rollout(tiny, tmp_path):
    """Rollouts of the calculator env (a scripted caller that reports log-probs): the collator's loss mask is 0 on
    every tool-output token, and the GRPO loss's gradient there is exactly 0, so a policy is never trained to
    write what the tool answered in its place."""
    from test_arithmetic import CalculatorAgent

    from hf_rollouts.envs.arithmetic import CalculatorEnv
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.publish import save_rollouts
    from hf_rollouts.training import RolloutCollator, grpo_loss, prepare_rollouts, token_logprobs
    from hf_rollouts.types import Action

    class WithLogprobs(CalculatorAgent):
        def act(self, request):
            action, state = super().act(request)
            return Action(action.text, action.token_ids, [-0.5] * len(action.token_ids), True), state

    model, tok = tiny
    env = CalculatorEnv(tok, {})
    tasks = env.get_train_dataset(2)
    agent = WithLogprobs(tok)
    rollouts = generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path / "c", progress=False, tokenizer=tok)
    assert all(n == 1 for row in rollouts["num_tool_calls"] for n in row)
    save_rollouts(rollouts, tmp_path / "saved")
    flat = prepare_rollouts(tmp_path / "saved", flatten=True, drop_constant_groups=False).dataset
    flat = flat.map(lambda r, i: {"advantage": 1.0 if i % 2 else -1.0}, with_indices=True)
    batch = RolloutCollator(tok.pad_token_id)(list(flat))
    tool = torch.zeros_like(batch["loss_mask"])
    for i, row in enumerate(flat):
        mask = rollouts["padded_tool_token_mask"][row["group_id"]][row["rollout_index"]]
        tool[i, : len(row["input_ids"])] = torch.tensor(mask[: len(row["input_ids"])])
    assert tool.sum() > 0 and (batch["loss_mask"][tool.bool()] == 0).all() and batch["loss_mask"].sum() > 0
    captured = {}

    def keep_logits(module, args, output):
        output.logits.retain_grad()
        captured["logits"] = output.logits

    handle = model.register_forward_hook(keep_logits)
    try:
        logprobs = token_logprobs(model, batch["input_ids"], batch["attention_mask"], 1.0)
    finally:
        handle.remove()
    loss, _ = grpo_loss(logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"])
    loss.backward()
    model.zero_grad(set_to_none=True)
    grad = captured["logits"].grad  # logits at position t - 1 score the token at position t
    scored_tool = torch.zeros_like(tool, dtype=torch.bool)
    scored_tool[:, :-1] = tool[:, 1:].bool()
    assert (grad[scored_tool] == 0).all() and (grad != 0).any()


def test_learning_report_combines_runs_into_one_json_and_figure(tmp_path):
    report = _script("learning_report")
    point = lambda p: {"success": p, "low": p - 0.1, "high": p + 0.1, "episodes": 10, "tool_rate": 0.0}  # noqa: E731
    for name, after in (("run", 0.9), ("control", 0.2)):
        (tmp_path / name).mkdir()
        summary = {
            "command": f"python x.py --{name}",
            "heldout_base": {**point(0.0), "successes": 0} if name == "run" else {"success": None, "successes": None},
            "heldout_before": point(0.3),
            "heldout_after": point(after),
            "steps": [{"step": 1, "reward": 0.3, "tool_rate": 0.5}, {"step": 2, "reward": after, "tool_rate": 0.6}],
            "wall_seconds": 10.4,
            "cpu_seconds": 5.2,
        }
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "docs" / "fig"
    runs = ["--run", f"GRPO={tmp_path / 'run'}", "--run", f"control={tmp_path / 'control'}"]
    assert report.main([*runs, "--out", str(out), "--title", "t"]) == 0
    saved = json.loads(out.with_suffix(".json").read_text())
    assert [r["label"] for r in saved["runs"]] == ["GRPO", "control"]
    assert saved["runs"][0]["change"] == pytest.approx(0.6) and saved["runs"][1]["after"]["success"] == 0.2
    assert saved["runs"][0]["command"] == "python x.py --run" and saved["runs"][0]["cpu_seconds"] == 5
    assert saved["runs"][0]["base"]["successes"] == 0 and "base" not in saved["runs"][1]  # not measured: left out
    assert out.with_suffix(".png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


def _task_files(tmp_path):
    """Arithmetic task rows as files (what another team's dataset-derived task hands the scripts): train rows as
    jsonl, held-out rows as parquet."""
    from hf_rollouts.envs.arithmetic import ArithmeticEnv
    from hf_rollouts.tiny_model import build_tiny_model

    env = ArithmeticEnv(build_tiny_model()[1], {})
    train, held = env.get_train_dataset(4), env.get_eval_dataset(5)
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in train.to_list()))
    held.to_parquet(str(tmp_path / "held.parquet"))
    return train, held


def test_train_grpo_takes_task_rows_from_files(grpo, tmp_path):
    train, held = _task_files(tmp_path)
    out = tmp_path / "run"
    argv = [
        *("--tasks", str(tmp_path / "train.jsonl"), "--eval-tasks-path", str(tmp_path / "held.parquet")),
        *("--eval-tasks", "3", "--iterations", "2", "--tasks-per-iter", "2", "--num-rollouts", "2"),
        *("--max-new-tokens", "3", "--keep-rollouts", "--quiet", "--plot", "none", "--output-dir", str(out)),
    ]
    history = grpo.train(grpo.parse_args(argv))
    assert len(history) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_before"]["episodes"] == 3  # the first 3 held-out rows of the file
    from datasets import load_from_disk

    played = [r for it in (0, 1) for r in load_from_disk(str(out / "rollouts" / f"iter{it:04d}"))["task_data"]]
    assert played == [r["task_data"] for r in train.to_list()]  # the file's rows, in order, not the env's split


def test_train_trl_takes_task_rows_from_files(trl_script, tmp_path):
    _task_files(tmp_path)
    argv = [
        *("--tasks", str(tmp_path / "train.jsonl"), "--eval-tasks-path", str(tmp_path / "held.parquet")),
        *("--eval-tasks", "2", "--max-steps", "1", "--tasks-per-step", "2", "--num-generations", "2"),
        *("--max-new-tokens", "3", "--quiet", "--output-dir", str(tmp_path / "trl")),
    ]
    rows = trl_script.train(trl_script.parse_args(argv))
    summary = json.loads((tmp_path / "trl" / "summary.json").read_text())
    assert len(rows) == 1 and summary["heldout_after"]["episodes"] == 2


# The flags and defaults each script's --help listed before its options moved into one module (hf_rollouts.recipes.runs)
# (captured from main at 69cd5b5): the scripts keep them exactly.
_COMMON = {"--seed": "0", "--model": "tiny", "--env-config": "None", "--control": "none", "--trainable-layers": "0",
           "--temperature": "1.0", "--quiet": "False"}  # fmt: skip
_FILES = {"--tasks": "None", "--eval-tasks-path": "None", "--low": "3", "--high": "3", "--eval-tasks": "0",
          "--eval-rollouts": "1", "--env": "guess_number", "--max-new-tokens": "3"}  # fmt: skip
_ROUNDS = {"--iterations": "20", "--num-rollouts": "8", "--minibatch-size": "64", "--clip-eps": "0.2",
           "--max-grad-norm": "1.0", "--plot": "None"}  # fmt: skip
SCRIPT_FLAGS = {
    "train_grpo": {**_COMMON, **_FILES, **_ROUNDS, "--output-dir": "outputs/train_grpo", "--tasks-per-iter": "32",
                   "--lr": "0.01", "--ppo-epochs": "1", "--advantage": "grpo", "--keep-constant-groups": "False",
                   "--max-turns": "1", "--model-size": "tiny", "--eval-every": "0", "--share-prefix": "False",
                   "--keep-rollouts": "False", "--keep-denormals": "False", "--backend": "transformers",
                   "--kv-cache-gib": "1.0", "--logprob-gap": "False", "--importance-sampling-cap": "None",
                   # issue 51: checkpoints and resume, run tracking, LoRA (hf_rollouts.recipes.train_config)
                   "--checkpoint-every": "0", "--keep-checkpoints": "2", "--resume": "False",
                   "--stop-after-round": "None", "--report-to": "none", "--run-name": "None", "--log-rollouts": "4",
                   "--lora-rank": "0", "--lora-alpha": "None",
                   "--max-staleness": "0", "--server-python": "None"},
    "train_tools": {**_COMMON, **_ROUNDS, "--output-dir": "outputs/train_tools", "--env": "hidden_function",
                    "--max-coef": "9", "--max-x": "9", "--max-turns": "2", "--demo-tool-rate": "0.5",
                    "--demo-tasks": "64", "--demo-rollouts": "4", "--sft-steps": "150", "--sft-batch-size": "32",
                    "--sft-lr": "0.003", "--tasks-per-iter": "16", "--lr": "0.003", "--max-new-tokens": "64",
                    "--eval-tasks": "64", "--eval-rollouts": "2", "--eval-base": "True", "--no-eval-base": "False",
                    "--sft-only": "False", "--trl": "False", "--with-control": "False"},
    "train_trl": {**_COMMON, **_FILES, "--max-steps": "30", "--num-generations": "8", "--tasks-per-step": "4",
                  "--steps-per-generation": "1", "--lr": "0.03", "--max-turns": "2", "--fp32": "False",
                  "--use-vllm": "False", "--vllm-server-base-url": "None", "--output-dir": "None"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SCRIPT_FLAGS))
def test_each_script_s_help_lists_the_flags_and_defaults_it_always_had(name, capsys):
    import re

    script = _script(name)
    try:
        with pytest.raises(SystemExit):
            script.parse_args(["--help"])
    finally:
        sys.modules.pop(name, None)
    options = capsys.readouterr().out.split("options:", 1)[1]
    listed = {}
    for block in re.split(r"\n(?=  -)", options):
        flags = re.split(r"\s{2,}", block.strip().split("\n")[0])[0]  # "--a_b A_B, --a-b A_B" or "--a A"
        if flags.startswith("--"):
            default = re.match(r".*\(default: (.*?)\)$", " ".join(block.split())).group(1)
            listed[re.findall(r"--[\w-]+", flags)[-1]] = default
    assert listed == SCRIPT_FLAGS[name]
