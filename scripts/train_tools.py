"""Teach a model to use a tool: an imitation warm start, then GRPO with the env's reward (library loop pieces).

Default: the tiny model on ``hidden_function`` (each task hides ``f(x) = a*x + b``; only the tool ``hidden_f`` tells
it; two turns: the call, then the number it returned). The random model never writes a tool call, so pure RL would
see a reward of 0 in every group. Three phases:

1. **Demonstrations** (:class:`Demonstrator`): a scripted token-level policy plays the train tasks through the
   pipeline, calling the tool on its first turn with probability ``--demo-tool-rate`` (else guessing a number).
2. **SFT** (:func:`hf_rollouts.training.sft_update`): cross-entropy on the demonstrations' agent tokens only (tool
   output and prompts are not in the loss): imitation alone is capped near ``--demo-tool-rate`` (``--sft-only``).
3. **GRPO** (:func:`~hf_rollouts.training.collect_rollouts`, :func:`~hf_rollouts.training.grpo_update`), or with
   ``--trl`` TRL's ``GRPOTrainer`` (:func:`hf_rollouts.integrations.trl.build_grpo_trainer`).

The held-out ``eval`` split is played as loaded, after SFT and after GRPO. With the tiny model the script runs end to
end but does not learn the task (it learns the call format, not to copy ``x``). **SmolLM2 on the calculator**
(docs/guides/training.md): ``--model smollm2-tools --env calculator`` (measured: held-out success 0.14 after the
warm start, 0.99 after GRPO; the control, ``--control shuffle``, 0.28)::

    python scripts/train_tools.py                    # tiny model, CPU; --sft-only / --trl / --control shuffle

``train(ToolTrainConfig(...))`` returns a :class:`ToolTrainResult`; ``summary.json`` records ``heldout_base`` (as
loaded), ``heldout_before`` (after SFT, where RL starts) and ``heldout_after``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import HfArgumentParser

from hf_rollouts.agents.base import Agent
from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.envs import get_env_class
from hf_rollouts.evaluation import wilson_interval
from hf_rollouts.seeding import derive_seed
from hf_rollouts.training import (
    UpdateConfig,
    collect_rollouts,
    flush_denormals,
    grpo_update,
    prepare_rollouts,
    save_learning_curve,
    sft_update,
    shuffle_advantages,
    train_top_layers,
    write_summary,
)
from hf_rollouts.types import Action, AgentRequest


@dataclass(frozen=True)
class DemoCall:
    """How the demonstrator calls an env's tool: its ``name``, a ``pattern`` finding the question in the prompt,
    ``arguments`` from that match, and ``right(arguments, task_data)``: the call asked the task's own question."""

    name: str
    pattern: re.Pattern
    arguments: Any
    right: Any


DEMO_CALLS = {
    "hidden_function": DemoCall(
        "hidden_f", re.compile(r"f\((-?\d+)\)"), lambda m: {"x": int(m.group(1))}, lambda a, t: a.get("x") == t["x"]
    ),
    "calculator": DemoCall(
        "calculator",
        re.compile(r"-?\d+ [-+*] -?\d+"),
        lambda m: {"expression": m.group(0)},
        lambda a, t: str(a.get("expression", "")).replace(" ", "") == f"{t['a']}{t['op']}{t['b']}",
    ),
}
"""The envs this script can demonstrate, by ``--env`` name."""


def flag(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class ToolTrainConfig:
    """Settings of :func:`train`; every field is a ``--flag`` of the script."""

    seed: int = flag(0, "Seeds the model init, demonstrations, sampling and batches.")
    output_dir: str = flag("outputs/train_tools", "metrics.json, summary.json and the plot go here.")
    model: str = flag("tiny", "'tiny' (random init), 'smollm2-tools' or a model id/path with a Hermes tool template.")
    env: str = flag("hidden_function", f"One of {sorted(DEMO_CALLS)}.")
    env_config: str | None = flag(None, "The env's env_config as JSON (hidden_function: --max-coef/-x/-turns).")
    max_coef: int = flag(9, "hidden_function max_coef (a, b in 1..max_coef).")
    max_x: int = flag(9, "hidden_function max_x (x in 1..max_x).")
    max_turns: int = flag(2, "hidden_function max_turns (tool turns count).")
    demo_tool_rate: float = flag(0.5, "Share of demonstrations whose first turn calls the tool (others guess).")
    demo_tasks: int = flag(64, "Train tasks the demonstrator plays.")
    demo_rollouts: int = flag(4, "Demonstrations per task.")
    sft_steps: int = flag(150, "SFT optimizer steps.")
    sft_batch_size: int = flag(32, "Demonstrations per SFT step.")
    sft_lr: float = flag(3e-3, "SFT AdamW learning rate.")
    iterations: int = flag(20, "GRPO generate-then-update rounds.")
    tasks_per_iter: int = flag(16, "Task rows (GRPO groups) per iteration.")
    num_rollouts: int = flag(8, "Rollouts per task (the group size).")
    lr: float = flag(3e-3, "GRPO AdamW learning rate.")
    minibatch_size: int = flag(64, "Rollouts per GRPO optimizer step.")
    clip_eps: float = flag(0.2, "PPO ratio clip.")
    max_grad_norm: float = flag(1.0, "Gradient clipping norm (SFT and GRPO).")
    max_new_tokens: int = flag(64, "Token budget of one agent turn (a call is 57).")
    temperature: float = flag(1.0, "Sampling temperature (log-probs are recomputed at the recorded one).")
    eval_tasks: int = flag(64, "Held-out eval tasks played before and after.")
    eval_rollouts: int = flag(2, "Rollouts per eval task.")
    eval_base: bool = flag(True, "Also evaluate the model as loaded (--no-eval-base: skip it, it is NaN).")
    sft_only: bool = flag(False, "Control: replace GRPO by as many more SFT updates on the demonstrations.")
    control: str = flag("none", "'shuffle': each group's advantages (TRL: rewards) shuffled in the group.")
    trainable_layers: int = flag(0, "Train only the top N decoder layers and the final norm (0: every parameter).")
    trl: bool = flag(False, "Run the GRPO phase with TRL's GRPOTrainer.")
    plot: str | None = flag(None, "PNG path (default OUTPUT_DIR/tool_learning.png); 'none' to skip.")
    quiet: bool = flag(False, "Do not print the tables.")


@dataclass
class Point:
    """Success on a batch of episodes (reward 1, over non-error episodes; ``[low, high]`` its 95% Wilson interval),
    ``tool_rate`` (episodes with a call), ``ok_calls`` (calls that ran), ``right_args`` (of those, calls that asked
    the task's own question; NaN without calls)."""

    phase: str
    step: int
    success: float
    tool_rate: float
    ok_calls: float
    right_args: float
    episodes: int
    errors: int
    seconds: float
    loss: float = math.nan
    low: float = math.nan
    high: float = math.nan


@dataclass
class ToolTrainResult:
    eval_before: Point
    eval_after_sft: Point
    eval_after: Point
    demos: Point
    sft: list[Point]
    grpo: list[Point]
    seconds: float


class Demonstrator(Agent):
    """The scripted behaviour policy of the module docstring; its coin is ``random.Random(request.seed)``, and its
    token ids are the tokenizer's encoding of its text plus the end token (what the model is taught to write)."""

    def __init__(self, tokenizer: Any, tool_rate: float, max_answer: int, call: DemoCall | None = None) -> None:
        self.tokenizer, self.tool_rate, self.max_answer = tokenizer, tool_rate, max_answer
        self.call = call or DEMO_CALLS["hidden_function"]

    def get_action(self, messages, agent_state=None):  # pragma: no cover - act() is the entry point
        raise NotImplementedError

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        rng, last = random.Random(request.seed), request.messages[-1]
        if last["role"] == "tool":
            text = str(last["content"]).strip()
        elif request.agent_state is None and rng.random() < self.tool_rate:
            asked = self.call.pattern.search(str(last["content"]))
            call = {"name": self.call.name, "arguments": self.call.arguments(asked)}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        else:
            text = str(rng.randint(1, self.max_answer))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Action(text, ids, None, True), (request.agent_state or 0) + 1

    def fingerprint(self) -> dict[str, Any]:
        return {**self._identity(), "tool_rate": self.tool_rate, "max_answer": self.max_answer, "tool": self.call.name}


def measure(rollouts, phase: str, step: int, seconds: float, loss: float = math.nan, call: DemoCall | None = None):
    """A :class:`Point` of a rollout dataset (``error`` episodes counted, not scored; failures in the interval)."""
    call = call or DEMO_CALLS["hidden_function"]
    statuses_by_row = rollouts["statuses"]
    statuses = [s for row in statuses_by_row for s in row]
    played = [(r, c, s) for rs, cs, ss in zip(rollouts["final_rewards"], rollouts["num_tool_calls"], statuses_by_row)
              for r, c, s in zip(rs, cs, ss) if s != "error"]  # fmt: skip
    ok, calls = [r for r, _, _ in played], [c for _, c, _ in played]
    records = [(r, t) for row, t in zip(rollouts["tool_calls"], rollouts["task_data"]) for ro in row for r in ro or []]
    asked = [bool(call.right(json.loads(r["arguments"]), t)) for r, t in records if r["status"] == "ok"]
    wins, n = sum(1 for r in ok if r == 1.0), max(1, len(ok))
    low, high = wilson_interval(wins, len(statuses))
    ran = sum(1 for r, _ in records if r["status"] == "ok") / len(records) if records else math.nan
    right = sum(asked) / len(asked) if asked else math.nan
    tool_rate = sum(1 for c in calls if c > 0) / n
    errors = statuses.count("error")
    return Point(phase, step, wins / n, tool_rate, ran, right, len(statuses), errors, seconds, loss, low, high)


def train(cfg: ToolTrainConfig, command: str | None = None) -> ToolTrainResult:
    """Run the three phases; float32 denormals are flushed meanwhile (the tiny model runs 10-20x slower on them)."""
    if cfg.env not in DEMO_CALLS:
        raise ValueError(f"--env must be one of {sorted(DEMO_CALLS)}, got {cfg.env!r}.")
    if cfg.control not in ("none", "shuffle") or (cfg.control == "shuffle" and cfg.sft_only):
        raise ValueError(f"--control must be 'none' or 'shuffle' (not with --sft-only), got {cfg.control!r}.")
    with flush_denormals():
        return _train(cfg, command)


def _train(cfg: ToolTrainConfig, command: str | None) -> ToolTrainResult:
    import datasets

    datasets.disable_progress_bars()
    started, out, call = (time.perf_counter(), time.process_time()), Path(cfg.output_dir), DEMO_CALLS[cfg.env]
    torch.manual_seed(cfg.seed)
    loaded = load_agent(cfg.model, model_seed=cfg.seed)
    model, tokenizer = loaded.model, loaded.tokenizer
    pad = tokenizer.pad_token_id
    if cfg.trainable_layers:
        train_top_layers(model, cfg.trainable_layers)
    agent = TransformersAgent(model, tokenizer, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                              seed=cfg.seed, name=f"{model.config._name_or_path}-tools")  # fmt: skip
    config = json.loads(cfg.env_config) if cfg.env_config else None
    if config is None and cfg.env == "hidden_function":
        config = {"max_coef": cfg.max_coef, "max_x": cfg.max_x, "max_turns": cfg.max_turns}
    env = get_env_class(cfg.env)(tokenizer, config or {})
    train_tasks = env.get_train_dataset(cfg.demo_tasks + max(1, cfg.iterations) * cfg.tasks_per_iter)
    eval_tasks = env.get_eval_dataset(cfg.eval_tasks)
    rl_tasks = train_tasks.select(range(cfg.demo_tasks, len(train_tasks)))

    def evaluate(phase: str) -> Point:
        t = time.perf_counter()
        rollouts = collect_rollouts(
            eval_tasks, agent, cfg.eval_rollouts, seed=derive_seed("train_tools_eval", cfg.seed)
        )
        point = measure(rollouts, phase, 0, time.perf_counter() - t, call=call)
        if not cfg.quiet:
            print(f"eval ({phase}): {format_point(point)}", flush=True)
        return point

    eval_before = evaluate("eval_before") if cfg.eval_base else Point("eval_before", 0, *[math.nan] * 4, 0, 0, 0.0)
    c = env.config  # the demonstrator guesses in the range of the env's answers
    answers = 2 * c.max_operand if cfg.env == "calculator" else c.max_coef * (c.max_x + 1)
    demonstrator = Demonstrator(tokenizer, cfg.demo_tool_rate, max_answer=answers, call=call)
    seed = derive_seed("train_tools_demos", cfg.seed)
    demos = collect_rollouts(train_tasks.select(range(cfg.demo_tasks)), demonstrator, cfg.demo_rollouts, seed=seed)
    demo_point = measure(demos, "demos", 0, 0.0, call=call)
    demo_rows = prepare_rollouts(demos, flatten=True, drop_constant_groups=False, progress=False).dataset
    if not cfg.quiet:
        print(f"demonstrations: {format_point(demo_point)}", flush=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    sft_opt = torch.optim.AdamW(trainable, lr=cfg.sft_lr, weight_decay=0.0)
    t = time.perf_counter()
    sft = dict(pad_token_id=pad, batch_size=cfg.sft_batch_size, max_grad_norm=cfg.max_grad_norm)
    losses = sft_update(model, sft_opt, demo_rows, steps=cfg.sft_steps, seed=derive_seed("sft", cfg.seed), **sft)
    sft_points = [Point("sft", cfg.sft_steps, *[math.nan] * 4, 0, 0, time.perf_counter() - t, losses[-1])]
    eval_after_sft = evaluate("eval_after_sft")
    grpo: list[Point] = []
    if cfg.trl:
        grpo = run_trl(model, tokenizer, rl_tasks, cfg)
    else:
        optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=0.0)
        update = UpdateConfig(cfg.minibatch_size, 1, cfg.clip_eps, 0.0, cfg.max_grad_norm, share_prefix=True)
        phase = "sft_only" if cfg.sft_only else "control" if cfg.control == "shuffle" else "grpo"
        for it in range(cfg.iterations):
            t, seed = time.perf_counter(), derive_seed("train_tools_grpo", cfg.seed, it)
            tasks = rl_tasks.select([(it * cfg.tasks_per_iter + k) % len(rl_tasks) for k in range(cfg.tasks_per_iter)])
            rollouts = collect_rollouts(tasks, agent, cfg.num_rollouts, seed=seed)
            if cfg.sft_only:
                steps = max(1, round(cfg.num_rollouts * cfg.tasks_per_iter / cfg.minibatch_size))
                loss = sft_update(model, sft_opt, demo_rows, steps=steps, seed=seed, **sft)[-1]
            else:
                rows = prepare_rollouts(rollouts, flatten=True, drop_constant_groups=True, progress=False).dataset
                if cfg.control == "shuffle" and len(rows):
                    rows = shuffle_advantages(rows, derive_seed("train_tools_control", seed))
                loss = grpo_update(model, optimizer, rows, pad_token_id=pad, config=update, seed=seed).loss
            grpo.append(measure(rollouts, phase, it, time.perf_counter() - t, loss, call=call))
            if not cfg.quiet:
                print(("" if it else TABLE_HEADER + "\n") + format_row(grpo[-1]), flush=True)
    eval_after = evaluate("eval_after")
    result = ToolTrainResult(eval_before, eval_after_sft, eval_after, demo_point, sft_points, grpo,
                             time.perf_counter() - started[0])  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    saved = {"config": dataclasses.asdict(cfg), "result": dataclasses.asdict(result)}
    (out / "metrics.json").write_text(json.dumps(saved, indent=1))

    def held(p: Point) -> dict:
        return {
            **dataclasses.asdict(p),
            "successes": None if math.isnan(p.success) else round(p.success * (p.episodes - p.errors)),
        }

    steps = [{"step": p.step + 1, "reward": p.success, "tool_rate": p.tool_rate} for p in grpo]
    evals = {"heldout_base": eval_before, "heldout_before": eval_after_sft, "heldout_after": eval_after}
    write_summary(out, command=command, config=dataclasses.asdict(cfg), steps=steps, started=started,
                  **{k: held(p) for k, p in evals.items()})  # fmt: skip
    plot = cfg.plot if cfg.plot is not None else str(out / "tool_learning.png")
    if plot.lower() != "none":
        rounds = [{"x": p.step + 1, "success": p.success, "tool_rate": p.tool_rate, "loss": p.loss} for p in grpo]
        evals = ((-1, eval_before), (0, eval_after_sft), (len(grpo) + 1, eval_after))
        points = [(x, dataclasses.asdict(p)) for x, p in evals if not math.isnan(p.success)]
        title = f"{cfg.env} (tool use), {cfg.model}: SFT {cfg.sft_steps} steps, then {cfg.iterations} GRPO rounds"
        save_learning_curve(plot, rounds, heldout=points, title=title, curves=("success", "tool_rate"),
                            xlabel="-1: as loaded, 0: after SFT, then GRPO rounds")  # fmt: skip
    return result


def run_trl(model, tokenizer, tasks, cfg: ToolTrainConfig) -> list[Point]:
    """The GRPO phase with TRL's ``GRPOTrainer``: one rollout call per iteration, split into minibatches of
    ``--minibatch-size``; one :class:`Point` per iteration from TRL's logs (its mean env reward: 1 for a win)."""
    from hf_rollouts.integrations.trl import build_grpo_trainer

    episodes = cfg.tasks_per_iter * cfg.num_rollouts
    per_call = max(1, episodes // cfg.minibatch_size)
    trainer, rollout_func = build_grpo_trainer(
        model, tokenizer, tasks, num_generations=cfg.num_rollouts, tasks_per_step=cfg.tasks_per_iter,
        steps_per_generation=per_call, max_steps=cfg.iterations * per_call, max_new_tokens=cfg.max_new_tokens,
        control=cfg.control, seed=cfg.seed, learning_rate=cfg.lr, temperature=cfg.temperature, bf16=False,
        max_grad_norm=cfg.max_grad_norm, epsilon=cfg.clip_eps,
    )  # fmt: skip
    trainer.train()
    model.eval()
    points = []
    for h in (h for h in trainer.state.log_history if "reward" in h):  # a log row per call carries the reward
        step = (int(h["step"]) - 1) // per_call
        rate = rollout_func.tool_rates[step] if step < len(rollout_func.tool_rates) else math.nan
        points.append(
            Point("trl", step, h["reward"], rate, math.nan, math.nan, 0, 0, math.nan, h.get("loss", math.nan))
        )
        if not cfg.quiet:
            print(("" if len(points) > 1 else TABLE_HEADER + "\n") + format_row(points[-1]), flush=True)
    return points


TABLE_HEADER = " | ".join(f"{h:>{w}}" for h, w in (("iter", 4), ("success", 7), ("tool use", 8), ("calls ok", 8),
                                                  ("right a", 7), ("loss", 8), ("sec", 5)))  # fmt: skip


def _num(x: float, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if x is None or math.isnan(x) else f"{x:>{width}.{digits}f}"


def format_row(p: Point) -> str:
    cells = [(p.success, 7, 3), (p.tool_rate, 8, 3), (p.ok_calls, 8, 3), (p.right_args, 7, 3), (p.loss, 8, 4),
             (p.seconds, 5, 1)]  # fmt: skip
    return f"{p.step:>4} | " + " | ".join(_num(*c) for c in cells)


def format_point(p: Point) -> str:
    return (f"success {p.success:.3f} [{_num(p.low, 0, 3)}, {_num(p.high, 0, 3)}], tool use {p.tool_rate:.3f}, "
            f"calls ok {_num(p.ok_calls, 0, 3)}, right args {_num(p.right_args, 0, 3)} ({p.episodes} episodes, "
            f"{p.errors} errors, {p.seconds:.1f} s)")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> ToolTrainConfig:
    """The flags of :class:`ToolTrainConfig` (transformers' ``HfArgumentParser``)."""
    (cfg,) = HfArgumentParser(ToolTrainConfig, description=__doc__.split("\n\n")[0]).parse_args_into_dataclasses(argv)
    return cfg


def main(argv: list[str] | None = None) -> int:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    r = train(cfg, command=shlex.join(["python", "scripts/train_tools.py", *argv]))
    rl = "SFT only" if cfg.sft_only else "GRPO, control: advantages shuffled" if cfg.control == "shuffle" else "GRPO"
    print(f"held-out success: {r.eval_before.success:.3f} (as loaded) -> {r.eval_after_sft.success:.3f} (after SFT) "
          f"-> {r.eval_after.success:.3f} (after {rl}); {r.seconds:.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
