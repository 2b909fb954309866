"""GRPO on an hf_rollouts environment with the library's loop pieces (default: the toy guess-the-number).

Each iteration collects rollouts of the current policy (:func:`hf_rollouts.training.collect_rollouts`: a fresh
seed, never a cache replay), prepares them (:func:`~hf_rollouts.training.prepare_rollouts`: GRPO advantages, error
and constant groups dropped and counted) and takes one GRPO update (:func:`~hf_rollouts.training.grpo_update`),
then prints a table row; held-out evaluations use :func:`hf_rollouts.evaluation.evaluate_agent`. The solve rate is
the rollouts' ``solved`` column (:func:`~hf_rollouts.evaluation.evaluation_of`).

The default task is ``GuessNumberEnv`` with ``low == high == 3`` and one turn: the random tiny model almost never
writes a 3, so the reward starts near 0 and GRPO raises it to 1. Runs with plain ``python`` or under a launcher
(``accelerate launch --num_processes 2``, or ``ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2`` on CPU: each
process generates its block of shards and takes its share of every minibatch)::

    python scripts/train_grpo.py --iterations 20 --output-dir outputs/grpo

**A real model** (docs/guides/training.md), the measured command: ``--model smollm2`` (or a model id/path),
``--env`` any registered env with ``--env-config`` JSON, or ``--tasks PATH`` (task rows: a save_to_disk folder or a
.json/.jsonl/.parquet file) with ``--eval-tasks-path PATH`` for held-out rows; ``--eval-tasks N`` held-out rows are
evaluated before, every ``--eval-every`` iterations and after (95% Wilson intervals); ``--control shuffle`` shuffles
each group's advantages (the control run); ``--trainable-layers K`` trains the top K layers only::

    python scripts/train_grpo.py --model smollm2 --env arithmetic --eval-tasks 160 --eval-every 5 --iterations 20 \\
        --tasks-per-iter 8 --num-rollouts 8 --minibatch-size 16 --lr 3e-5 --temperature 0.7 --max-new-tokens 12 \\
        --trainable-layers 10

It writes ``metrics.json`` (a row per iteration), ``summary.json`` and the plot; ``--iterations 0`` only evaluates
(a base rate). ``train(TrainConfig(...))`` is importable and returns the per-iteration stats.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from transformers import HfArgumentParser

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.evaluation import evaluate_agent, evaluation_of
from hf_rollouts.seeding import derive_seed
from hf_rollouts.training import (
    ADVANTAGE_MODES,
    UpdateConfig,
    collect_rollouts,
    flush_denormals,
    grpo_update,
    prepare_rollouts,
    save_learning_curve,
    shuffle_advantages,
    task_splits,
    train_top_layers,
    write_summary,
)

CONTROLS = ("none", "shuffle")


def flag(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Settings of :func:`train`; every field is a ``--flag`` of the script."""

    iterations: int = flag(20, "Generate-then-update rounds.")
    seed: int = flag(0, "Seeds model init, sampling and minibatch order.")
    output_dir: str = flag("outputs/train_grpo", "metrics.json, summary.json and the plot go here.")
    tasks_per_iter: int = flag(32, "Task rows (GRPO groups) per iteration.")
    num_rollouts: int = flag(8, "Rollouts per task (the group size).")
    lr: float = flag(1e-2, "AdamW learning rate (1e-2 suits the tiny model; 3e-5 for SmolLM2).")
    minibatch_size: int = flag(64, "Rollouts per optimizer step (16 for SmolLM2).")
    ppo_epochs: int = flag(1, "Passes over each iteration's rollouts.")
    clip_eps: float = flag(0.2, "PPO ratio clip.")
    max_grad_norm: float = flag(1.0, "Gradient clipping norm.")
    advantage: str = flag("grpo", f"One of {ADVANTAGE_MODES}.")
    keep_constant_groups: bool = flag(False, "Train on groups with zero reward variance too.")
    low: int = flag(3, "GuessNumberEnv low.")
    high: int = flag(3, "GuessNumberEnv high (== low: a fixed answer the policy can learn).")
    max_turns: int = flag(1, "GuessNumberEnv max_turns.")
    max_new_tokens: int = flag(3, "Token budget of one agent turn.")
    temperature: float = flag(1.0, "Sampling temperature (log-probs are recomputed at the one the rollouts record).")
    model_size: str = flag("tiny", "build_tiny_model size: tiny or small.")
    model: str = flag("tiny", "'tiny' (embedded, --model-size), 'smollm2', 'smollm2-tools' or a model id/path.")
    env: str = flag("guess_number", "A registered env name or an env class path.")
    env_config: str | None = flag(None, "The env's env_config as JSON (guess_number: from --low, --high, --max-turns).")
    tasks: str | None = flag(None, "Task rows to train on (save_to_disk folder, .json/.jsonl/.parquet); no --env then.")
    eval_tasks_path: str | None = flag(None, "Held-out task rows (as --tasks); --eval-tasks N takes the first N.")
    eval_tasks: int = flag(0, "Held-out rows (the env's eval split or --eval-tasks-path) to evaluate on; 0: no.")
    eval_rollouts: int = flag(1, "Episodes per held-out row.")
    eval_every: int = flag(0, "Also evaluate every N iterations (0: before and after).")
    control: str = flag("none", f"One of {CONTROLS}: 'shuffle' permutes the advantages within each group.")
    trainable_layers: int = flag(0, "Train only the top N decoder layers and the final norm (0: every parameter).")
    share_prefix: bool = flag(False, "Run the tokens every row of a minibatch begins with once.")
    plot: str | None = flag(None, "PNG path (default OUTPUT_DIR/learning_curve.png); 'none' to skip.")
    keep_rollouts: bool = flag(False, "Save every iteration's rollouts under OUTPUT_DIR/rollouts.")
    quiet: bool = flag(False, "Do not print the table.")
    keep_denormals: bool = flag(False, "Do not flush float32 denormals (the tiny model runs 10-20x slower with them).")


@dataclass
class IterationStats:
    """One row of the learning curve: ``mean_reward`` and ``solve_rate`` (the ``solved`` column; errors count as
    unsolved) of the rollouts sampled before the iteration's update, the update's means (NaN without a step),
    rollouts kept / generated, whether the agent's fingerprint moved, and the held-out evaluation after, if any."""

    iteration: int
    mean_reward: float
    solve_rate: float
    loss: float
    trained_rollouts: int
    rollouts: int
    errors: int
    clip_fraction: float
    approx_kl: float
    grad_norm: float
    fingerprint_changed: bool
    seconds: float
    tool_rate: float = 0.0
    heldout: dict | None = None


def task_sets(cfg, tokenizer, num_train: int):
    """``(train rows, held-out rows)`` of ``--tasks`` / ``--eval-tasks-path`` or the env's splits."""
    config = json.loads(cfg.env_config) if cfg.env_config else None
    if config is None and cfg.env == "guess_number":
        config = {"low": cfg.low, "high": cfg.high, "max_turns": cfg.max_turns}
    return task_splits(tokenizer, env=cfg.env, env_config=config, tasks=cfg.tasks, eval_tasks=cfg.eval_tasks_path,
                       num_train=num_train, num_eval=cfg.eval_tasks)  # fmt: skip


def train(cfg: TrainConfig, command: str | None = None) -> list[IterationStats]:
    """Run GRPO as the module docstring says; one :class:`IterationStats` per iteration (``command`` goes to
    ``summary.json``)."""
    if cfg.advantage not in ADVANTAGE_MODES or cfg.control not in CONTROLS:
        raise ValueError(f"--advantage must be one of {ADVANTAGE_MODES} and --control one of {CONTROLS}.")
    with flush_denormals(not cfg.keep_denormals):
        return _train(cfg, command)


def _train(cfg: TrainConfig, command: str | None) -> list[IterationStats]:
    started, accelerator, out = (time.perf_counter(), time.process_time()), Accelerator(), Path(cfg.output_dir)
    torch.manual_seed(cfg.seed)
    loaded = load_agent(
        "tiny-small" if cfg.model == "tiny" and cfg.model_size != "tiny" else cfg.model, model_seed=cfg.seed
    )
    model, tokenizer = loaded.model, loaded.tokenizer
    agent = TransformersAgent(
        model,
        tokenizer,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        device=accelerator.device,
        name=f"{model.config._name_or_path}-grpo",
    )
    params = train_top_layers(model, cfg.trainable_layers) if cfg.trainable_layers else list(model.parameters())
    policy, optimizer = accelerator.prepare(model, torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0))
    all_tasks, eval_tasks = task_sets(cfg, tokenizer, cfg.tasks_per_iter * cfg.iterations)
    update = UpdateConfig(cfg.minibatch_size, cfg.ppo_epochs, cfg.clip_eps, 0.0, cfg.max_grad_norm, cfg.share_prefix)
    main = accelerator.is_main_process

    def heldout(tag: str) -> dict | None:
        if eval_tasks is None:
            return None
        result = evaluate_agent(eval_tasks, agent, cfg.eval_rollouts, seed=derive_seed("train_grpo_eval", cfg.seed))
        if main and not cfg.quiet:
            print(f"held-out ({tag}): {result.describe()}", flush=True)
        return result.as_dict()

    base, history = heldout("eval_before"), []
    for it in range(cfg.iterations):
        start, seed = time.perf_counter(), derive_seed("train_grpo", cfg.seed, it)
        probe = agent.fingerprint()["weights_probe"]
        tasks = all_tasks.select([(it * cfg.tasks_per_iter + j) % len(all_tasks) for j in range(cfg.tasks_per_iter)])
        rollouts = collect_rollouts(tasks, agent, cfg.num_rollouts, seed=seed)
        if cfg.keep_rollouts and main:
            rollouts.save_to_disk(str(out / "rollouts" / f"iter{it:04d}"))
        with accelerator.main_process_first():
            prepared = prepare_rollouts(rollouts, flatten=True, advantage=cfg.advantage,
                                        drop_constant_groups=not cfg.keep_constant_groups, progress=False)  # fmt: skip
        rows = prepared.dataset
        if cfg.control == "shuffle" and len(rows):
            rows = shuffle_advantages(rows, derive_seed("train_grpo_control", cfg.seed, it))
        played = evaluation_of(rollouts)
        m = grpo_update(policy, optimizer, rows, pad_token_id=tokenizer.pad_token_id, config=update, seed=seed,
                        accelerator=accelerator)  # fmt: skip
        changed = agent.fingerprint()["weights_probe"] != probe
        if m.steps and not changed:
            print(f"warning: iteration {it}: the weights probe did not move with the update.", file=sys.stderr)
        report = prepared.report
        stats = IterationStats(it, played.mean_reward, played.success, m.loss, report.rollouts_out,
                               report.rollouts_in, report.errors, m.clip_fraction, m.approx_kl, m.grad_norm, changed,
                               time.perf_counter() - start, played.tool_rate)  # fmt: skip
        history.append(stats)
        if main and not cfg.quiet:
            print(("" if it else TABLE_HEADER + "\n") + format_row(stats), flush=True)
        if it == cfg.iterations - 1 or (cfg.eval_every and (it + 1) % cfg.eval_every == 0):
            stats.heldout = heldout(f"eval_{it:04d}")
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps([dataclasses.asdict(s) for s in history], indent=1))
        curve = [{"iteration": s.iteration, **s.heldout} for s in history if s.heldout]
        steps = [{"step": s.iteration + 1, "reward": s.mean_reward, "success": s.solve_rate, "tool_rate": s.tool_rate}
                 for s in history]  # fmt: skip
        after = history[-1].heldout if history else base
        write_summary(out, command=command, config=dataclasses.asdict(cfg), steps=steps, started=started,
                      heldout_before=base, heldout_after=after, heldout_curve=curve)  # fmt: skip
        plot = cfg.plot if cfg.plot is not None else str(out / "learning_curve.png")
        if plot.lower() != "none" and history:
            rounds = [{"x": s.iteration, "reward": s.mean_reward, "solve rate": s.solve_rate,
                       "tool_rate": s.tool_rate, "loss": s.loss} for s in history]  # fmt: skip
            points = ([(-1, base)] if base else []) + [(s.iteration, s.heldout) for s in history if s.heldout]
            control = ", CONTROL: advantages shuffled" if cfg.control == "shuffle" else ""
            title = f"GRPO, {cfg.model}, {cfg.tasks or cfg.env}, {cfg.tasks_per_iter}x{cfg.num_rollouts}/iter{control}"
            save_learning_curve(plot, rounds, heldout=points, title=title, curves=("reward", "solve rate", "tool_rate"))
    return history


TABLE_HEADER = (
    f"{'iter':>4} | {'mean_reward':>11} | {'solve_rate':>10} | {'loss':>8} | {'grad_norm':>9} | "
    f"{'trained':>7} | {'clip':>5} | {'sec':>5}"
)


def format_row(s: IterationStats) -> str:
    """One table line; ``-`` where no update happened (every group had equal rewards and was dropped)."""

    def num(x: float, width: int, digits: int) -> str:
        return f"{'-':>{width}}" if math.isnan(x) else f"{x:>{width}.{digits}f}"

    return (
        f"{s.iteration:>4} | {s.mean_reward:>11.4f} | {s.solve_rate:>10.4f} | {num(s.loss, 8, 4)} | "
        f"{num(s.grad_norm, 9, 4)} | {s.trained_rollouts:>3}/{s.rollouts:<3} | {num(s.clip_fraction, 5, 3)} | "
        f"{s.seconds:>5.1f}"
    )


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The flags of :class:`TrainConfig` (transformers' ``HfArgumentParser``)."""
    (cfg,) = HfArgumentParser(TrainConfig, description=__doc__.split("\n\n")[0]).parse_args_into_dataclasses(argv)
    return cfg


def main(argv: list[str] | None = None) -> int:
    import datasets
    import transformers

    datasets.disable_progress_bars()  # the table is this script's output
    transformers.utils.logging.disable_progress_bar()
    argv = sys.argv[1:] if argv is None else argv
    history = train(parse_args(argv), command=shlex.join(["python", "scripts/train_grpo.py", *argv]))
    if history and PartialState().is_main_process:
        first, last = history[0], history[-1]
        print(
            f"mean reward: {first.mean_reward:.4f} (iteration 0) -> {last.mean_reward:.4f} (iteration {last.iteration})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
