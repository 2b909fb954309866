"""scripts/train_tools.py: demonstrations are token-exact training rows, and a small run learns the call format."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tt():
    spec = importlib.util.spec_from_file_location("train_tools", ROOT / "scripts" / "train_tools.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_tools"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("train_tools", None)


def test_demonstrations_are_token_exact_rows_whose_agent_mask_is_the_demonstrator_s_tokens(tt, tmp_path):
    from hf_rollouts.chat.tool_turns import template_messages
    from hf_rollouts.envs.hidden_function import HiddenFunctionEnv
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.publish import save_rollouts
    from hf_rollouts.tiny_model import build_tiny_model
    from hf_rollouts.training import prepare_rollouts

    _, tok = build_tiny_model(seed=0)
    env = HiddenFunctionEnv(tok, {"max_turns": 2})
    tasks = env.get_train_dataset(6)
    demo = tt.Demonstrator(tok, tool_rate=0.5, max_answer=90)
    rollouts = generate_rollouts(tasks, demo, 4, seed=3, cache_dir=tmp_path / "c", progress=False)
    save_rollouts(rollouts, tmp_path / "saved")
    rows = prepare_rollouts(tmp_path / "saved", flatten=True, drop_constant_groups=False).dataset
    assert len(rows) == 24
    callers = winners = 0
    for row in rows:
        conv = template_messages(rollouts["conversations"][row["group_id"]][row["rollout_index"]])
        task = json.loads(rollouts["task_data"][row["group_id"]])
        ids, mask = row["input_ids"], row["agent_mask"]
        # token-exact: the row is the chat template's render of the stored conversation (plus its final "\n")
        rendered = tok.apply_chat_template(conv, tools=env.chat.tools, tokenize=False)
        assert tok.decode(ids) + "\n" == rendered
        # the loss mask covers exactly what the demonstrator wrote: its token ids, eos included, turn by turn
        expected = []
        for m in conv:
            if m["role"] != "assistant":
                continue
            if m.get("tool_calls"):
                x = m["tool_calls"][0]["function"]["arguments"]["x"]
                assert x == task["x"]
                text = f'<tool_call>\n{{"name": "hidden_f", "arguments": {{"x": {x}}}}}\n</tool_call>'
            else:
                text = m["content"]
            expected += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert [t for t, a in zip(ids, mask) if a] == expected
        tool_msgs = [m for m in conv if m["role"] == "tool"]
        if tool_msgs:  # the tool's answer is in the row but never in the loss mask
            callers += 1
            answer = task["a"] * task["x"] + task["b"]
            assert tool_msgs[0]["content"] == str(answer) and row["final_reward"] == 1.0
        winners += row["final_reward"] == 1.0
    assert 0 < callers < 24 and winners >= callers


def test_a_small_run_learns_to_write_parseable_tool_calls(tt, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same float summation order wherever it runs
    cfg = tt.ToolTrainConfig(
        output_dir=str(tmp_path),
        demo_tasks=16,
        demo_rollouts=2,
        demo_tool_rate=1.0,
        sft_steps=60,
        sft_batch_size=8,
        sft_lr=1e-2,
        iterations=1,
        tasks_per_iter=2,
        num_rollouts=4,
        minibatch_size=8,
        eval_tasks=16,
        eval_rollouts=1,
        plot="none",
        quiet=True,
    )
    try:
        r = tt.train(cfg)
    finally:
        torch.set_num_threads(threads)
    # the random init never writes a call; after imitation the model calls hidden_f and the calls parse and run
    assert r.eval_before.tool_rate == 0.0 and math.isnan(r.eval_before.ok_calls)
    assert r.eval_after_sft.tool_rate > 0.25 and r.eval_after_sft.ok_calls > 0.2
    assert r.demos.tool_rate == 1.0 and r.demos.success == 1.0 and r.demos.right_args == 1.0
    assert len(r.grpo) == 1 and r.grpo[0].episodes == 8
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert (
        saved["config"]["sft_steps"] == 60
        and saved["result"]["eval_after_sft"]["tool_rate"] == r.eval_after_sft.tool_rate
    )


def test_calculator_demonstrations_call_with_the_question_and_a_smoke_run_writes_the_summary(tt, tmp_path):
    """The path `--model smollm2-tools --env calculator --control shuffle --trainable-layers K` takes, on the tiny
    model: demonstrations that call the calculator win with the question's own expression, and a few steps run."""
    cfg = tt.ToolTrainConfig(
        output_dir=str(tmp_path),
        env="calculator",
        demo_tasks=8,
        demo_rollouts=2,
        demo_tool_rate=0.5,
        sft_steps=2,
        sft_batch_size=4,
        iterations=2,
        tasks_per_iter=2,
        num_rollouts=4,
        minibatch_size=8,
        eval_tasks=6,
        eval_rollouts=1,
        eval_base=False,
        max_new_tokens=8,
        control="shuffle",
        trainable_layers=1,
        plot="none",
        quiet=True,
    )
    r = tt.train(cfg, command="python scripts/train_tools.py --env calculator")
    assert 0 < r.demos.tool_rate < 1 and r.demos.right_args == 1.0 and r.demos.ok_calls == 1.0
    assert r.demos.success >= r.demos.tool_rate  # every call wins (guesses rarely do)
    assert [p.phase for p in r.grpo] == ["control", "control"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["command"].endswith("calculator") and summary["heldout_after"]["episodes"] == 6
    assert math.isnan(summary["heldout_base"]["success"]) and summary["heldout_base"]["successes"] is None  # skipped
    assert summary["heldout_before"]["low"] <= summary["heldout_before"]["success"] <= summary["heldout_before"]["high"]
    assert [s["step"] for s in summary["steps"]] == [1, 2] and summary["cpu_seconds"] > 0
    with pytest.raises(ValueError, match="--env must be one of"):
        tt.train(tt.ToolTrainConfig(env="arithmetic"))


def _smollm2_tools_tokenizer(base):
    """The embedded tokenizer with SmolLM2's special tokens (ChatML, eos ``<|im_end|>``, as Qwen2.5's) and the
    ``smollm2-tools`` template (hf_rollouts.smollm2.tools_chat_template): the family's render and tool-call parse."""
    from test_chat_templates import family_tokenizer

    from hf_rollouts.smollm2 import tools_chat_template

    tok = family_tokenizer(base, "qwen2_5")
    tok.chat_template = tools_chat_template()
    return tok


@pytest.mark.parametrize("family", ["tiny", "smollm2-tools"])
def test_the_demonstrator_s_calls_reach_the_harness_as_openai_tool_calls(tt, family):
    """`--env program-calculator`: the Demonstrator answers the harness's calls (scripts/calculator_agent.py, a plain
    openai loop); the endpoint parses its `<tool_call>` into OpenAI `tool_calls`, the harness runs the calculator and
    sends the result back as a `tool` message, the Demonstrator repeats it, the verifier scores it 1."""
    from hf_rollouts.envs.arithmetic import CalculatorEnv
    from hf_rollouts.rounds import collect_rollouts
    from hf_rollouts.tiny_model import build_tiny_model

    tok = build_tiny_model(seed=0)[1]
    tok = tok if family == "tiny" else _smollm2_tools_tokenizer(tok)
    env = CalculatorEnv(tok, {"operators": "*"})
    tasks = tt.program_tasks(env, env.get_train_dataset(3), max_calls=2)
    demo = tt.Demonstrator(tok, 1.0, 10, call=tt.DEMO_CALLS["calculator"])
    rollouts = collect_rollouts(tasks, demo, 1, seed=0, allowed_env_modules=["calculator_agent"])
    for row in rollouts:
        task = json.loads(row["task_data"])
        assert row["statuses"] == ["done"] and row["final_rewards"] == [1.0] and row["num_samples"] == [1]
        (record,) = row["tool_calls"][0]  # parsed by the endpoint, run by the harness: the next prompt extends
        assert record["name"] == "calculator" and record["status"] == "ok"
        assert json.loads(record["arguments"]) == {"expression": f"{task['a']} * {task['b']}"}
        conv = row["conversations"][0]
        assert [m["role"] for m in conv] == ["system", "user", "assistant", "tool", "assistant"]
        assert conv[3]["content"] == conv[4]["content"] == str(task["a"] * task["b"]) == task["answer"]
    point = tt.measure(rollouts, "demos", 0, 0.0, call=tt.DEMO_CALLS["calculator"])
    assert (point.tool_rate, point.ok_calls, point.right_args, point.success) == (1.0, 1.0, 1.0, 1.0)


def test_the_tiny_model_trains_through_the_harness_with_its_control_end_to_end(tt, tmp_path):
    """`--env program-calculator --with-control` on the tiny model: demonstrations through the harness, the warm
    start, a GRPO round on the program's rollouts, then the control arm from the same warm start."""
    cfg = tt.ToolTrainConfig(
        output_dir=str(tmp_path),
        env="program-calculator",
        env_config='{"operators": "*"}',
        demo_tasks=4,
        demo_rollouts=2,
        demo_tool_rate=0.5,
        sft_steps=2,
        sft_batch_size=4,
        iterations=1,
        tasks_per_iter=2,
        num_rollouts=2,
        minibatch_size=4,
        eval_tasks=3,
        eval_rollouts=1,
        eval_base=False,
        max_new_tokens=8,
        with_control=True,
        plot="none",
        quiet=True,
    )
    r = tt.train(cfg, command="python scripts/train_tools.py --env program-calculator --with-control")
    assert r.demos.ok_calls == 1.0 and r.demos.right_args == 1.0 and 0 < r.demos.tool_rate <= r.demos.success
    assert [p.phase for p in r.grpo] == ["grpo"] and [p.phase for p in r.control] == ["control"]
    assert r.grpo[0].episodes == r.control[0].episodes == 4 and r.grpo[0].errors == 0
    for path in (tmp_path, tmp_path / "control"):
        summary = json.loads((path / "summary.json").read_text())
        assert summary["heldout_after"]["episodes"] == 3 and summary["heldout_after"]["errors"] == 0
        assert summary["heldout_before"] == json.loads((tmp_path / "summary.json").read_text())["heldout_before"]
    assert summary["heldout_after"]["success"] == r.eval_after_control.success
    with pytest.raises(ValueError, match="--with-control"):
        tt.train(tt.ToolTrainConfig(with_control=True, control="shuffle"))
