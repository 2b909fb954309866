"""Teach the tiny model to use a tool, on CPU: imitation warm start, then GRPO with the env's reward.

The env is ``hidden_function`` (:class:`~hf_rollouts.envs.hidden_function.HiddenFunctionEnv`): each task hides
``f(x) = a*x + b``; the prompt asks for ``f(x)`` and only the tool ``hidden_f`` tells it. Winning takes two
turns: a tool call (in the tiny model's Hermes-style format, 56 tokens:
``<tool_call>\\n{"name": "hidden_f", "arguments": {"x": 7}}\\n</tool_call>``, with the asked ``x`` copied from
the prompt) and then the number the tool returned, copied from the tool message. ``max_turns`` is 2 here, so
only a call on the first turn can win.

Why a warm start: the randomly initialised model never writes a tool call (it would have to sample 56 given
tokens out of ~1000 in a row; :func:`count_call_attempts` measures it: no ``<tool_call>`` at all in thousands
of samples), so pure RL from scratch sees a reward of 0 in every group and has nothing to learn from.

The three phases:

1. **Demonstrations** (:class:`Demonstrator`): a scripted token-level behaviour policy plays the train tasks
   through the pipeline. On its first turn it calls the tool with probability ``demo_tool_rate`` and otherwise
   guesses a number; after a tool result it answers with it, after a wrong guess it guesses again. Its
   rollouts are a normal rollout dataset, saved and loaded back through :func:`hf_rollouts.training.prepare_rollouts`.
2. **SFT** (imitation): cross-entropy on the demonstration tokens, where the rollout's ``agent_mask`` is exactly
   the loss mask (tool output and prompts are 0): the same data format serves SFT and RL. All demonstrations
   are imitated, won or lost, so the imitating model learns the format and to call the tool about
   ``demo_tool_rate`` of the time: imitation alone is capped near ``demo_tool_rate`` (see ``--sft-only``).
3. **GRPO** (as in ``scripts/train_grpo.py``): sample with the current policy through the pipeline, load back
   through :mod:`hf_rollouts.training`, take clipped policy-gradient steps with group-normalised advantages of
   the env's reward. Whatever the success rate gains above the imitation cap comes from the reward.
   ``--trl`` runs this phase with TRL's ``GRPOTrainer`` and the ``hf_rollouts.integrations.trl`` bridge instead.

The held-out ``eval`` split (tasks never trained on) is played before training, after SFT and after GRPO.

Measured with these defaults (docs/guides/tools.md): the tiny model learns the call format in SFT but neither copies
``x`` from the prompt nor the tool's answer, so its calls never win; GRPO then rewards lucky guesses only and drops
the tool. The script runs end to end (also ``--trl``), but it does not show the tiny model learning the task yet. ::

    python scripts/train_tools.py                    # seed 0, tiny model, CPU
    python scripts/train_tools.py --sft-only         # control: imitation for as many updates, no reward
    python scripts/train_tools.py --trl              # phase 3 with TRL's GRPOTrainer

**SmolLM2 on the calculator** (docs/guides/training.md): ``--model smollm2-tools --env calculator``. SmolLM2-135M
never writes a tool call unprompted (0-3% of episodes with the tools listed, even with an example in the prompt), so
the same warm start comes first: a few SFT steps on demonstrations that call the calculator half of the time, after
which it calls the tool in some episodes and copies the numbers; then GRPO with the env's reward. ``--control shuffle``
is the control (the same GRPO updates, each group's advantages shuffled among its rollouts); ``--trainable-layers``
trains only the top decoder layers; the held-out evaluations carry 95% Wilson intervals and ``summary.json`` records
the command, the evaluations (``heldout_base``: the model as loaded, ``heldout_before``: after SFT, where RL starts,
``heldout_after``), the per-iteration curve, wall and CPU time.

Demonstrations are written in the Hermes format (``<tool_call>`` JSON), which the tiny model and ``smollm2-tools``
use; ``--env`` is ``hidden_function`` or ``calculator`` (:data:`DEMO_CALLS`).

``train(ToolTrainConfig(...))`` is importable and returns a :class:`ToolTrainResult`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader
from transformers import HfArgumentParser

from hf_rollouts.agents.base import Agent
from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.envs import get_env_class
from hf_rollouts.evaluation import wilson_interval
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import save_rollouts
from hf_rollouts.seeding import derive_seed
from hf_rollouts.training import (
    RolloutCollator,
    grpo_loss,
    model_device,
    prepare_rollouts,
    shuffle_advantages,
    token_logprobs,
    train_top_layers,
)
from hf_rollouts.types import Action, AgentRequest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@dataclass(frozen=True)
class DemoCall:
    """How the demonstrator calls an env's tool and how a call is judged: the tool's ``name``, a ``pattern`` that finds
    what the question asks in its text, ``arguments`` built from that match, and ``right`` (a call's arguments, the
    task's data) -> whether the call asked for the task's own question."""

    name: str
    pattern: re.Pattern
    arguments: Any
    right: Any


def _same_expression(args: dict, task: dict) -> bool:
    return str(args.get("expression", "")).replace(" ", "") == f"{task['a']}{task['op']}{task['b']}"


DEMO_CALLS = {
    "hidden_function": DemoCall(
        "hidden_f", re.compile(r"f\((-?\d+)\)"), lambda m: {"x": int(m.group(1))}, lambda a, t: a.get("x") == t["x"]
    ),
    "calculator": DemoCall(
        "calculator", re.compile(r"-?\d+ [-+*] -?\d+"), lambda m: {"expression": m.group(0)}, _same_expression
    ),
}
"""The envs this script can demonstrate, by ``--env`` name."""


@dataclass
class ToolTrainConfig:
    """Settings of :func:`train`; every field is a ``--flag`` of the script."""

    seed: int = field(default=0, metadata={"help": "Seeds the model init, demonstrations, sampling and batches."})
    output_dir: str = field(default="outputs/train_tools", metadata={"help": "metrics.json and the plot go here."})
    model: str = field(
        default="tiny",
        metadata={
            "help": "'tiny' (random init), 'smollm2-tools' or a model id/path with a Hermes-style tool template."
        },
    )
    env: str = field(default="hidden_function", metadata={"help": f"One of {sorted(DEMO_CALLS)}."})
    env_config: str | None = field(
        default=None,
        metadata={
            "help": "The env's env_config as JSON (default for hidden_function: --max-coef, --max-x, --max-turns)."
        },
    )
    max_coef: int = field(default=9, metadata={"help": "hidden_function max_coef (a, b in 1..max_coef)."})
    max_x: int = field(default=9, metadata={"help": "hidden_function max_x (x in 1..max_x)."})
    max_turns: int = field(default=2, metadata={"help": "hidden_function max_turns (tool turns count)."})
    demo_tool_rate: float = field(
        default=0.5, metadata={"help": "Share of demonstrations whose first turn calls the tool (others guess)."}
    )
    demo_tasks: int = field(default=64, metadata={"help": "Train tasks the demonstrator plays."})
    demo_rollouts: int = field(default=4, metadata={"help": "Demonstrations per task."})
    sft_steps: int = field(default=150, metadata={"help": "SFT optimizer steps."})
    sft_batch_size: int = field(default=32, metadata={"help": "Demonstrations per SFT step."})
    sft_lr: float = field(default=3e-3, metadata={"help": "SFT AdamW learning rate."})
    iterations: int = field(default=20, metadata={"help": "GRPO generate-then-update rounds."})
    tasks_per_iter: int = field(default=16, metadata={"help": "Task rows (GRPO groups) per iteration."})
    num_rollouts: int = field(default=8, metadata={"help": "Rollouts per task (the group size)."})
    lr: float = field(default=3e-3, metadata={"help": "GRPO AdamW learning rate."})
    minibatch_size: int = field(default=64, metadata={"help": "Rollouts per GRPO optimizer step."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (SFT and GRPO)."})
    max_new_tokens: int = field(default=64, metadata={"help": "Token budget of one agent turn (a call is 57)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (also for log-probs)."})
    eval_tasks: int = field(default=64, metadata={"help": "Held-out eval tasks played before and after."})
    eval_rollouts: int = field(default=2, metadata={"help": "Rollouts per eval task."})
    eval_base: bool = field(
        default=True,
        metadata={"help": "Also evaluate the model as loaded, before SFT (--no-eval-base: skip it, it is NaN)."},
    )
    sft_only: bool = field(
        default=False,
        metadata={"help": "Control: replace GRPO by as many more SFT updates on the demonstrations (no reward)."},
    )
    control: str = field(
        default="none",
        metadata={"help": "'shuffle': the control run, each group's advantages (TRL: rewards) shuffled in the group."},
    )
    trainable_layers: int = field(
        default=0, metadata={"help": "Train only the top N decoder layers and the final norm (0: every parameter)."}
    )
    trl: bool = field(default=False, metadata={"help": "Run the GRPO phase with TRL's GRPOTrainer."})
    plot: str | None = field(
        default=None, metadata={"help": "PNG path (default OUTPUT_DIR/tool_learning.png); 'none' to skip."}
    )
    quiet: bool = field(default=False, metadata={"help": "Do not print the tables."})


@dataclass
class Point:
    """Success on one batch of episodes: ``success`` = reward 1 (won), ``tool_rate`` = share of episodes with at
    least one tool call (both over non-error episodes), ``ok_calls`` = share of calls that ran (status ``ok``; the
    rest were malformed, named no tool or had bad arguments), ``right_args`` = share of the calls that ran which asked
    for the task's own question (``x``, or the expression; NaN without calls); ``[low, high]``: the 95% Wilson
    interval of ``success``."""

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
    phase_seconds: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- the demonstrator


class Demonstrator(Agent):
    """A scripted token-level behaviour policy (see the module docstring): on its first turn it calls the env's tool
    (:class:`DemoCall`, default hidden_function's) with probability ``tool_rate``, else guesses a number in
    ``1..max_answer``; after a tool result it answers with it.

    Its coin is drawn from ``random.Random(request.seed)``, so a seeded run gives the same demonstrations.
    Its token ids are the tokenizer's encoding of the text plus the end token: what the model is taught to write.
    """

    def __init__(self, tokenizer: Any, tool_rate: float, max_answer: int, call: DemoCall | None = None) -> None:
        self.tokenizer, self.tool_rate, self.max_answer = tokenizer, tool_rate, max_answer
        self.call = call or DEMO_CALLS["hidden_function"]

    def get_action(self, messages, agent_state=None):  # pragma: no cover - act() is the entry point
        raise NotImplementedError

    def act(self, request: AgentRequest) -> tuple[Action, Any]:
        rng = random.Random(request.seed)
        last = request.messages[-1]
        if last["role"] == "tool":
            text = str(last["content"]).strip()
        elif request.agent_state is None and rng.random() < self.tool_rate:
            asked = self.call.pattern.search(str(request.messages[-1]["content"]))
            call = {"name": self.call.name, "arguments": self.call.arguments(asked)}
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        else:
            text = str(rng.randint(1, self.max_answer))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Action(text, ids, None, True), (request.agent_state or 0) + 1

    def fingerprint(self) -> dict[str, Any]:
        return {**self._identity(), "tool_rate": self.tool_rate, "max_answer": self.max_answer, "tool": self.call.name}


# --------------------------------------------------------------------------- measuring


def measure(
    rollouts, phase: str, step: int, seconds: float, loss: float = math.nan, call: DemoCall | None = None
) -> Point:
    """A :class:`Point` from a rollout dataset (episodes with status ``error`` are counted, not scored; they count
    as failures in the interval); ``call`` judges the calls' arguments (default: hidden_function's)."""
    call = call or DEMO_CALLS["hidden_function"]
    rewards = [r for row in rollouts["final_rewards"] for r in row]
    statuses = [s for row in rollouts["statuses"] for s in row]
    calls = [c for row in rollouts["num_tool_calls"] for c in row]
    records, asked = [], []
    for row, task in zip(rollouts["tool_calls"], rollouts["task_data"]):
        for rollout in row:
            for record in rollout or []:
                records.append(record)
                if record["status"] == "ok":
                    asked.append(bool(call.right(json.loads(record["arguments"]), task)))
    ok = [r for r, s in zip(rewards, statuses) if s != "error"]
    n = max(1, len(ok))
    wins = sum(1 for r in ok if r == 1.0)
    low, high = wilson_interval(wins, len(statuses))
    return Point(
        phase=phase,
        step=step,
        success=wins / n,
        tool_rate=sum(1 for c, s in zip(calls, statuses) if s != "error" and c > 0) / n,
        ok_calls=sum(1 for c in records if c["status"] == "ok") / len(records) if records else math.nan,
        right_args=sum(asked) / len(asked) if asked else math.nan,
        episodes=len(statuses),
        errors=statuses.count("error"),
        seconds=seconds,
        loss=loss,
        low=low,
        high=high,
    )


def count_call_attempts(rollouts) -> tuple[int, int]:
    """``(agent turns whose text contains "<tool_call>", agent turns)``: how often a policy even starts a call."""
    attempts = turns = 0
    for row in rollouts["conversations"]:
        for conversation in row:
            for m in conversation or []:
                if m["role"] == "assistant":
                    turns += 1
                    attempts += bool(m.get("tool_calls")) or "<tool_call>" in str(m.get("content") or "")
    return attempts, turns


# --------------------------------------------------------------------------- SFT


def sft_collate(rows: list[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad flattened rollout rows; ``loss_mask`` is the rollout's ``agent_mask`` (the SFT loss mask)."""
    width = max(len(r["input_ids"]) for r in rows)
    out = {
        "input_ids": torch.full((len(rows), width), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(rows), width), dtype=torch.float32),
    }
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        out["input_ids"][i, :n] = torch.tensor(r["input_ids"])
        out["attention_mask"][i, :n] = torch.tensor(r["attention_mask"])
        out["loss_mask"][i, :n] = torch.tensor(r["agent_mask"], dtype=torch.float32) * out["attention_mask"][i, :n]
    return out


def trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def sft_optimizer(model, cfg: ToolTrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(trainable(model), lr=cfg.sft_lr, weight_decay=0.0)


def sft_steps(
    model, dataset, cfg: ToolTrainConfig, steps: int, pad_token_id: int, seed: int, optimizer=None
) -> list[float]:
    """``steps`` AdamW steps of token-mean cross-entropy on the agent tokens; returns the losses. Pass the same
    ``optimizer`` to continue a run (a fresh AdamW's first steps are large: the control keeps one)."""
    optimizer = optimizer if optimizer is not None else sft_optimizer(model, cfg)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=cfg.sft_batch_size,
        shuffle=True,
        generator=generator,
        collate_fn=lambda rows: sft_collate(rows, pad_token_id),
    )
    losses: list[float] = []
    device = model_device(model)
    model.train()
    while len(losses) < steps:
        for batch in loader:
            batch = send_to_device(batch, device)  # the model may be on CUDA (where the agent put it)
            mask = batch["loss_mask"]
            logprobs = token_logprobs(
                model, batch["input_ids"], batch["attention_mask"], 1.0, loss_mask=mask, share_prefix=True
            )
            loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable(model), cfg.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
            if len(losses) == steps:
                break
    model.eval()
    return losses


# --------------------------------------------------------------------------- GRPO


def grpo_iteration(model, optimizer, collator, rollouts, saved: Path, cfg: ToolTrainConfig, seed: int) -> float:
    """Save, load back through prepare_rollouts (GRPO advantages, constant groups dropped), one pass of updates
    (with ``--control shuffle``, each group's advantages shuffled among its rollouts first)."""
    save_rollouts(rollouts, saved, overwrite=True)
    dataset = prepare_rollouts(saved, flatten=True, advantage="grpo", drop_constant_groups=True).dataset
    if not len(dataset):
        return math.nan
    if cfg.control == "shuffle":
        dataset = shuffle_advantages(dataset, derive_seed("train_tools_control", seed))
    loader = DataLoader(
        dataset,
        batch_size=cfg.minibatch_size,
        shuffle=True,
        collate_fn=collator,
        generator=torch.Generator().manual_seed(seed),
    )
    losses = []
    device = model_device(model)
    model.train()
    for batch in loader:
        batch = send_to_device(batch, device)
        logprobs = token_logprobs(
            model,
            batch["input_ids"],
            batch["attention_mask"],
            cfg.temperature,
            loss_mask=batch["loss_mask"],
            share_prefix=True,  # the system prompt and the tool list: one pass for the batch
        )
        loss, metrics = grpo_loss(
            logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"], clip_eps=cfg.clip_eps
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable(model), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(metrics["loss"])
    model.eval()
    return sum(losses) / len(losses)


# --------------------------------------------------------------------------- the run


def env_config(cfg: ToolTrainConfig) -> dict[str, Any]:
    if cfg.env_config:
        return json.loads(cfg.env_config)
    if cfg.env == "hidden_function":
        return {"max_coef": cfg.max_coef, "max_x": cfg.max_x, "max_turns": cfg.max_turns}
    return {}


def max_answer(cfg: ToolTrainConfig, env) -> int:
    """The demonstrator's guesses are drawn from ``1..max_answer``: the range of the env's answers."""
    if cfg.env == "calculator":
        return 2 * env.config.max_operand
    return env.config.max_coef * (env.config.max_x + 1)


def train(cfg: ToolTrainConfig, command: str | None = None) -> ToolTrainResult:
    """Run the three phases of the module docstring; float32 denormals are flushed to zero meanwhile (the tiny
    model hits them and runs 10-20x slower on x86 without it). ``command`` is recorded in ``summary.json``."""
    if cfg.env not in DEMO_CALLS:
        raise ValueError(f"--env must be one of {sorted(DEMO_CALLS)}, got {cfg.env!r}.")
    if cfg.control not in ("none", "shuffle") or (cfg.control == "shuffle" and cfg.sft_only):
        raise ValueError(f"--control must be 'none' or 'shuffle' (not with --sft-only), got {cfg.control!r}.")
    flushing = torch.set_flush_denormal(True)
    try:
        return _train(cfg, command)
    finally:
        if flushing:
            torch.set_flush_denormal(False)


def _train(cfg: ToolTrainConfig, command: str | None) -> ToolTrainResult:
    import datasets

    datasets.disable_progress_bars()
    start, cpu_start = time.perf_counter(), time.process_time()
    out = Path(cfg.output_dir)
    scratch = out / "scratch"
    torch.manual_seed(cfg.seed)
    loaded = load_agent(cfg.model, model_seed=cfg.seed)
    model, tokenizer = loaded.model, loaded.tokenizer
    if cfg.trainable_layers:
        train_top_layers(model, cfg.trainable_layers)
    call = DEMO_CALLS[cfg.env]
    agent = TransformersAgent(
        model,
        tokenizer,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        name=f"{model.config._name_or_path}-tools",
    )
    env = get_env_class(cfg.env)(tokenizer, env_config(cfg))
    # the RL phase cycles through the tasks the demonstrations left
    train_tasks = env.get_train_dataset(cfg.demo_tasks + max(1, cfg.iterations) * cfg.tasks_per_iter)
    eval_tasks = env.get_eval_dataset(cfg.eval_tasks)
    demo_tasks = train_tasks.select(range(cfg.demo_tasks))
    rl_tasks = train_tasks.select(range(cfg.demo_tasks, len(train_tasks))) if cfg.iterations else None

    def play(tasks, player, n: int, seed: int, name: str):
        return generate_rollouts(
            tasks,
            player,
            n,
            seed=seed,
            cache_dir=scratch / name,
            load_from_cache_file=False,
            progress=False,
        )

    def evaluate(phase: str) -> Point:
        t = time.perf_counter()
        rollouts = play(eval_tasks, agent, cfg.eval_rollouts, derive_seed("train_tools_eval", cfg.seed), phase)
        point = measure(rollouts, phase, 0, time.perf_counter() - t, call=call)
        if not cfg.quiet:
            print(f"eval ({phase}): {format_point(point)}", flush=True)
        return point

    seconds: dict[str, float] = {}
    t = time.perf_counter()
    eval_before = evaluate("eval_before") if cfg.eval_base else Point("eval_before", 0, *[math.nan] * 4, 0, 0, 0.0)

    # 1. demonstrations, through the pipeline, saved and loaded back as training data
    demonstrator = Demonstrator(tokenizer, cfg.demo_tool_rate, max_answer=max_answer(cfg, env), call=call)
    demos = play(demo_tasks, demonstrator, cfg.demo_rollouts, derive_seed("train_tools_demos", cfg.seed), "demos")
    demo_point = measure(demos, "demos", 0, 0.0, call=call)
    save_rollouts(demos, scratch / "demos_saved", overwrite=True)
    demo_data = prepare_rollouts(scratch / "demos_saved", flatten=True, drop_constant_groups=False).dataset
    if not cfg.quiet:
        print(f"demonstrations: {format_point(demo_point)}", flush=True)
    seconds["eval_and_demos"] = time.perf_counter() - t

    # 2. SFT
    t = time.perf_counter()
    sft_opt = sft_optimizer(model, cfg)
    losses = sft_steps(
        model, demo_data, cfg, cfg.sft_steps, tokenizer.pad_token_id, derive_seed("sft", cfg.seed), sft_opt
    )
    seconds["sft"] = time.perf_counter() - t
    sft_points = [Point("sft", cfg.sft_steps, *[math.nan] * 4, 0, 0, seconds["sft"], losses[-1])]
    eval_after_sft = evaluate("eval_after_sft")

    # 3. GRPO (or the control)
    t = time.perf_counter()
    grpo: list[Point] = []
    if cfg.trl:
        grpo = run_trl(model, tokenizer, rl_tasks, cfg)
    else:
        optimizer = torch.optim.AdamW(trainable(model), lr=cfg.lr, weight_decay=0.0)
        collator = RolloutCollator(tokenizer.pad_token_id, advantage="grpo")
        for it in range(cfg.iterations):
            t_it = time.perf_counter()
            seed = derive_seed("train_tools_grpo", cfg.seed, it)
            tasks = rl_tasks.select([(it * cfg.tasks_per_iter + k) % len(rl_tasks) for k in range(cfg.tasks_per_iter)])
            rollouts = play(tasks, agent, cfg.num_rollouts, seed, f"grpo{it:03d}")
            if cfg.sft_only:
                per_iter = max(1, round(cfg.num_rollouts * cfg.tasks_per_iter / cfg.minibatch_size))
                loss = sft_steps(model, demo_data, cfg, per_iter, tokenizer.pad_token_id, seed, sft_opt)[-1]
            else:
                loss = grpo_iteration(model, optimizer, collator, rollouts, scratch / f"grpo{it:03d}_saved", cfg, seed)
            phase = "sft_only" if cfg.sft_only else "control" if cfg.control == "shuffle" else "grpo"
            point = measure(rollouts, phase, it, time.perf_counter() - t_it, loss, call=call)
            grpo.append(point)
            if not cfg.quiet:
                if it == 0:
                    print(TABLE_HEADER, flush=True)
                print(format_row(point), flush=True)
            shutil.rmtree(scratch / f"grpo{it:03d}", ignore_errors=True)
            shutil.rmtree(scratch / f"grpo{it:03d}_saved", ignore_errors=True)
    seconds["grpo"] = time.perf_counter() - t
    eval_after = evaluate("eval_after")
    shutil.rmtree(scratch, ignore_errors=True)
    result = ToolTrainResult(
        eval_before=eval_before,
        eval_after_sft=eval_after_sft,
        eval_after=eval_after,
        demos=demo_point,
        sft=sft_points,
        grpo=grpo,
        seconds=time.perf_counter() - start,
        phase_seconds=seconds,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(
        json.dumps({"config": dataclasses.asdict(cfg), "result": dataclasses.asdict(result)}, indent=1)
    )
    (out / "summary.json").write_text(json.dumps(summary(result, cfg, command, cpu_start), indent=1))
    plot = cfg.plot if cfg.plot is not None else str(out / "tool_learning.png")
    if plot.lower() != "none":
        save_plot([result], Path(plot), cfg)
    return result


def summary(result: ToolTrainResult, cfg: ToolTrainConfig, command: str | None, cpu_start: float) -> dict:
    """``summary.json``, in the shape ``scripts/learning_report.py`` reads (``heldout_before`` is after SFT: where
    RL starts; ``heldout_base`` is the model as loaded)."""

    def held(p: Point) -> dict:
        return {
            "success": p.success,
            "low": p.low,
            "high": p.high,
            "successes": None if math.isnan(p.success) else round(p.success * (p.episodes - p.errors)),
            "episodes": p.episodes,
            "errors": p.errors,
            "tool_rate": p.tool_rate,
            "right_args": p.right_args,
        }

    return {
        "command": command,
        "config": dataclasses.asdict(cfg),
        "heldout_base": held(result.eval_before),
        "heldout_before": held(result.eval_after_sft),
        "heldout_after": held(result.eval_after),
        "steps": [{"step": p.step + 1, "reward": p.success, "tool_rate": p.tool_rate} for p in result.grpo],
        "wall_seconds": result.seconds,
        "cpu_seconds": time.process_time() - cpu_start,
        "torch_threads": torch.get_num_threads(),
    }


# --------------------------------------------------------------------------- TRL


def run_trl(model, tokenizer, tasks, cfg: ToolTrainConfig) -> list[Point]:
    """The GRPO phase with TRL's ``GRPOTrainer``: one rollout call per iteration, its episodes split into minibatches
    of ``minibatch_size`` (TRL's ``steps_per_generation``), as the script's own loop does; one :class:`Point` per
    iteration from TRL's logs (success = TRL's logged mean env reward, which is 1 exactly for a win here).
    ``--control shuffle`` scores with :func:`~hf_rollouts.integrations.trl.shuffled_env_reward`."""
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from hf_rollouts.integrations.trl import env_reward, make_rollout_func, shuffled_env_reward, to_trl_dataset

    rollout_func = make_rollout_func(max_new_tokens=cfg.max_new_tokens)
    tool_rates: list[float] = []

    def rollout(prompts, trainer):  # the bridge's rollout function, noting each batch's tool-call rate
        out = rollout_func(prompts, trainer)
        played = [e for e in rollout_func.last_episodes if e["status"] != "error"]
        tool_rates.append(sum(1 for e in played if e.get("num_tool_calls", 0) > 0) / max(1, len(played)))
        return out

    episodes = cfg.tasks_per_iter * cfg.num_rollouts
    per_generation = max(1, episodes // cfg.minibatch_size)
    if episodes % per_generation:
        raise ValueError(f"--trl needs {episodes} episodes per iteration to split into minibatches of equal size.")
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="train_tools_trl_"),
        max_steps=cfg.iterations * per_generation,
        steps_per_generation=per_generation,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        num_generations=cfg.num_rollouts,
        per_device_train_batch_size=episodes // per_generation,
        temperature=cfg.temperature,
        seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),  # TRL keeps the model where the agent put it
        bf16=False,
        gradient_checkpointing=False,
        max_grad_norm=cfg.max_grad_norm,
        epsilon=cfg.clip_eps,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=to_trl_dataset(tasks),
        reward_funcs=[shuffled_env_reward(cfg.num_rollouts, cfg.seed) if cfg.control == "shuffle" else env_reward],
        rollout_func=rollout,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    model.eval()
    points = []
    for h in trainer.state.log_history:
        if "reward" in h:  # logged on the steps that generated: one per iteration
            step = (int(h["step"]) - 1) // per_generation
            rate = tool_rates[step] if step < len(tool_rates) else math.nan
            p = Point("trl", step, h["reward"], rate, math.nan, math.nan, 0, 0, math.nan, h.get("loss", math.nan))
            points.append(p)
            if not cfg.quiet:
                print(("" if len(points) > 1 else TABLE_HEADER + "\n") + format_row(p), flush=True)
    return points


# --------------------------------------------------------------------------- output

TABLE_HEADER = (
    f"{'iter':>4} | {'success':>7} | {'tool use':>8} | {'calls ok':>8} | {'right a':>7} | {'loss':>8} | {'sec':>5}"
)


def _num(x: float, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if x is None or math.isnan(x) else f"{x:>{width}.{digits}f}"


def format_row(p: Point) -> str:
    return (
        f"{p.step:>4} | {_num(p.success, 7, 3)} | {_num(p.tool_rate, 8, 3)} | {_num(p.ok_calls, 8, 3)} | "
        f"{_num(p.right_args, 7, 3)} | "
        f"{_num(p.loss, 8, 4)} | {_num(p.seconds, 5, 1)}"
    )


def format_point(p: Point) -> str:
    return (
        f"success {p.success:.3f} [{_num(p.low, 0, 3)}, {_num(p.high, 0, 3)}], tool use {p.tool_rate:.3f}, "
        f"calls ok {_num(p.ok_calls, 0, 3)}, "
        f"right args {_num(p.right_args, 0, 3)} "
        f"({p.episodes} episodes, {p.errors} errors, {p.seconds:.1f} s)"
    )


def save_plot(
    results: list[ToolTrainResult], path: Path, cfg: ToolTrainConfig, labels: list[str] | None = None
) -> bool:
    """Success rate per GRPO iteration (one line per result), with the eval points before/after; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping {path} (pip install 'hf_rollouts[plot]').", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for k, r in enumerate(results):
        label = labels[k] if labels else f"seed {cfg.seed}"
        its = [p.step + 1 for p in r.grpo]
        line = ax.plot(
            [-1, 0, *its],
            [r.eval_before.success, r.eval_after_sft.success, *[p.success for p in r.grpo]],
            marker="o",
            markersize=3,
            label=label,
        )[0]
        ax.plot(
            [its[-1] + 1] if its else [1], [r.eval_after.success], marker="*", markersize=10, color=line.get_color()
        )
    ax.axhline(
        cfg.demo_tool_rate, color="grey", linestyle=":", label=f"demonstrations' tool rate ({cfg.demo_tool_rate})"
    )
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("-1: random init, 0: after SFT, then GRPO iterations; star: held-out eval after")
    ax.set_ylabel("success rate")
    ax.set_title(
        f"{cfg.env} (tool use), {cfg.model}: SFT {cfg.sft_steps} steps on {cfg.demo_tasks}x{cfg.demo_rollouts} "
        f"demos, GRPO {cfg.tasks_per_iter}x{cfg.num_rollouts}/iter",
        fontsize=8,
    )
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"saved plot to {path}")
    return True


def parse_args(argv: list[str] | None = None) -> ToolTrainConfig:
    """The flags of :class:`ToolTrainConfig` (transformers' ``HfArgumentParser``, as the CLI builds its own)."""
    (cfg,) = HfArgumentParser(ToolTrainConfig, description=__doc__.split("\n\n")[0]).parse_args_into_dataclasses(argv)
    return cfg


def main(argv: list[str] | None = None) -> int:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import shlex

    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    r = train(cfg, command=shlex.join(["python", "scripts/train_tools.py", *argv]))
    rl = "SFT only" if cfg.sft_only else "GRPO, control: advantages shuffled" if cfg.control == "shuffle" else "GRPO"
    print(
        f"held-out success: {r.eval_before.success:.3f} (as loaded) -> {r.eval_after_sft.success:.3f} (after SFT) "
        f"-> {r.eval_after.success:.3f} (after {rl}); {r.seconds:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
