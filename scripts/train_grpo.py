"""GRPO on an hf_rollouts environment, end to end through the rollout datasets (default: the toy guess-the-number).

Each iteration:

1. generate rollouts with the current policy (:func:`hf_rollouts.pipeline.generate_rollouts`,
   a fresh cache directory and a per-iteration seed, so no sample is ever stale);
2. save them (:func:`hf_rollouts.publish.save_rollouts`) and load them back
   through :func:`hf_rollouts.training.prepare_rollouts` (GRPO advantages, error
   and constant groups dropped and counted);
3. take optimizer steps on :func:`hf_rollouts.training.grpo_loss` with
   :class:`hf_rollouts.training.RolloutCollator` batches;

then print a table (iteration, mean reward, solve rate, loss) and plot the curve.

The default task is ``GuessNumberEnv`` with ``low == high == 3``: the prompt is
"Guess the number between 3 and 3. Answer with one number." and one turn is
allowed. The randomly initialised tiny model almost never writes a 3 (it samples
near-uniformly from ~1000 tokens), so the reward starts near 0; the optimal
policy gets 1. Every bit of improvement comes from the reward: GRPO raises the
probability of the rare sampled answers that named the number. (With a random
target in a wider range one turn cannot beat chance, since the prompt carries no
information about the target.) For this env the reward is 1 exactly when the game
ends by naming the number, so mean reward and solve rate coincide; both are shown
because other envs shape rewards. The loss column is near 0 by construction: on
the first step of an iteration the ratio is 1 and group-normalised advantages
average to about 0 over tokens; the gradient norm shows the update's size.

Runs with plain ``python`` or under a distributed launcher (each process
generates its block of shards; the prepared DataLoader splits the training
batches and DDP averages the gradients)::

    python scripts/train_grpo.py --iterations 20 --output-dir outputs/grpo
    accelerate launch --num_processes 2 scripts/train_grpo.py            # GPUs
    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 scripts/train_grpo.py  # 2 CPU processes

(On CPU, ``accelerate launch --cpu --num_processes 2`` starts a single process
unless an MPI hostfile is configured; ``torchrun`` starts two.)

**A real model** (docs/guides/training.md): ``--model smollm2`` (or ``smollm2-tools`` for a tool env, or a
model id/path), ``--env`` any registered env (``arithmetic``, ``calculator``, ...) with ``--env-config`` JSON, and
``--eval-tasks N``: the policy is evaluated on N held-out rows (the env's eval split, one seed) before training,
every ``--eval-every`` iterations and after, with a 95% Wilson interval (:mod:`hf_rollouts.evaluation`).
``--control shuffle`` is the control run: the same updates, but each group's advantages are shuffled among its
rollouts, so the update no longer follows the reward. ``--trainable-layers K`` trains only the top K decoder
layers (and the final norm), which makes a CPU update of SmolLM2 about twice as fast::

    python scripts/train_grpo.py --model smollm2 --env arithmetic --eval-tasks 160 --iterations 20 \\
        --tasks-per-iter 8 --num-rollouts 8 --lr 2e-5 --temperature 0.7 --max-new-tokens 12 --trainable-layers 10

Besides ``metrics.json`` (one row per iteration) it writes ``summary.json``: the command, the held-out
evaluations, wall and CPU time of the process. ``--iterations 0`` only evaluates: a base rate of any model on any
env.

``train(TrainConfig(...))`` is importable and returns the per-iteration stats.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from torch.utils.data import DataLoader
from transformers import HfArgumentParser

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.envs import get_env_class
from hf_rollouts.evaluation import evaluate_agent
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import save_rollouts
from hf_rollouts.seeding import derive_seed
from hf_rollouts.training import (
    ADVANTAGE_MODES,
    RolloutCollator,
    grpo_loss,
    prepare_rollouts,
    shuffle_advantages,
    token_logprobs,
    train_top_layers,
)

CONTROLS = ("none", "shuffle")


@dataclass
class TrainConfig:
    """Settings of :func:`train`; every field is a ``--flag`` of the script."""

    iterations: int = field(default=20, metadata={"help": "Generate-then-update rounds."})
    seed: int = field(default=0, metadata={"help": "Seeds model init, sampling and minibatch order."})
    output_dir: str = field(
        default="outputs/train_grpo", metadata={"help": "Rollouts, metrics.json and the plot go here."}
    )
    tasks_per_iter: int = field(default=32, metadata={"help": "Task rows (GRPO groups) per iteration."})
    num_rollouts: int = field(default=8, metadata={"help": "Rollouts per task (the group size)."})
    lr: float = field(default=1e-2, metadata={"help": "AdamW learning rate."})
    minibatch_size: int = field(default=64, metadata={"help": "Rollouts per optimizer step."})
    ppo_epochs: int = field(default=1, metadata={"help": "Passes over each iteration's rollouts."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm."})
    advantage: str = field(default="grpo", metadata={"help": f"One of {ADVANTAGE_MODES}."})
    keep_constant_groups: bool = field(
        default=False, metadata={"help": "Train on groups with zero reward variance too."}
    )
    low: int = field(default=3, metadata={"help": "GuessNumberEnv low."})
    high: int = field(
        default=3, metadata={"help": "GuessNumberEnv high (== low: a fixed answer the policy can learn)."}
    )
    max_turns: int = field(default=1, metadata={"help": "GuessNumberEnv max_turns."})
    max_new_tokens: int = field(default=3, metadata={"help": "Token budget of one agent turn."})
    temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature (also used to recompute log-probs)."}
    )
    model_size: str = field(default="tiny", metadata={"help": "build_tiny_model size: tiny or small."})
    model: str = field(
        default="tiny",
        metadata={
            "help": "'tiny' (the embedded random-weight model, --model-size), 'smollm2', 'smollm2-tools' (with a tool "
            "template) or a model id/path (hf_rollouts.agents.loading)."
        },
    )
    env: str = field(default="guess_number", metadata={"help": "A registered env name or an env class path."})
    env_config: str | None = field(
        default=None,
        metadata={"help": "The env's env_config as JSON (default for guess_number: from --low, --high, --max-turns)."},
    )
    tasks: str | None = field(
        default=None,
        metadata={
            "help": "Train on these task rows (a save_to_disk folder or a .json/.jsonl/.parquet file) instead of the "
            "env's train split; with it --env is not needed."
        },
    )
    eval_tasks: int = field(default=0, metadata={"help": "Held-out rows (the env's eval split) to evaluate on; 0: no."})
    eval_tasks_path: str | None = field(
        default=None,
        metadata={
            "help": "Held-out task rows (as --tasks) instead of the env's eval split; --eval-tasks N: the first N."
        },
    )
    eval_rollouts: int = field(default=1, metadata={"help": "Episodes per held-out row."})
    eval_every: int = field(default=0, metadata={"help": "Also evaluate every N iterations (0: before and after)."})
    control: str = field(
        default="none",
        metadata={"help": f"One of {CONTROLS}: 'shuffle' permutes the advantages within each group (control run)."},
    )
    trainable_layers: int = field(
        default=0, metadata={"help": "Train only the top N decoder layers and the final norm (0: every parameter)."}
    )
    share_prefix: bool = field(
        default=False,
        metadata={"help": "Run the tokens every row of a minibatch begins with once (token_logprobs' share_prefix)."},
    )
    plot: str | None = field(
        default=None, metadata={"help": "PNG path (default OUTPUT_DIR/learning_curve.png); 'none' to skip."}
    )
    keep_rollouts: bool = field(
        default=False, metadata={"help": "Keep every iteration's saved rollouts (default: the last only)."}
    )
    quiet: bool = field(default=False, metadata={"help": "Do not print the table."})
    keep_denormals: bool = field(
        default=False,
        metadata={
            "help": "Do not call torch.set_flush_denormal(True). By default the process flushes float32 denormals to "
            "zero: "
            "on x86 CPUs the tiny model's math hits denormals and runs 10-20x slower without it."
        },
    )


@dataclass
class IterationStats:
    """One row of the learning curve.

    ``mean_reward`` and ``solve_rate`` (share of status ``done``: the game ended,
    which in guess_number means the number was named) are over the iteration's
    non-error rollouts, sampled from the policy *before* that iteration's update.
    ``loss``, ``clip_fraction``, ``approx_kl`` and ``grad_norm`` average this
    process's optimizer steps (NaN when no group had a reward spread).
    ``trained_rollouts`` / ``rollouts``: kept by :func:`prepare_rollouts` / generated.
    ``fingerprint_changed``: the agent's cache fingerprint moved with the update.
    """

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
    phase_seconds: dict[str, float] = field(default_factory=dict)
    tool_rate: float = 0.0
    heldout: dict | None = None
    """The held-out :class:`~hf_rollouts.evaluation.Evaluation` after this iteration's update, when one ran."""


def steps_row(s: IterationStats) -> dict:
    """One iteration as ``summary.json``'s ``steps`` rows, the shape ``scripts/train_trl.py`` writes (step counted
    from 1; ``reward`` is the mean reward of the rollouts sampled before the step's update)."""
    return {"step": s.iteration + 1, "reward": s.mean_reward, "success": s.solve_rate, "tool_rate": s.tool_rate}


def iteration_seed(seed: int, iteration: int) -> int:
    """The sampling seed of one iteration: distinct across iterations and runs."""
    return derive_seed("train_grpo", seed, iteration)


def _task_slice(tasks, iteration: int, n: int):
    idx = [(iteration * n + j) % len(tasks) for j in range(n)]
    return tasks.select(idx)


def train(cfg: TrainConfig, command: str | None = None) -> list[IterationStats]:
    """Run GRPO as described in the module docstring; return one :class:`IterationStats` per iteration.

    ``command`` is recorded in ``summary.json`` (``main`` passes the command line).

    Unless ``cfg.keep_denormals``, float32 denormals are flushed to zero while it
    runs (``torch.set_flush_denormal``, a process-wide switch turned off again at the end).
    """
    if cfg.advantage not in ADVANTAGE_MODES:
        raise ValueError(f"--advantage must be one of {ADVANTAGE_MODES}, got {cfg.advantage!r}.")
    if cfg.control not in CONTROLS:
        raise ValueError(f"--control must be one of {CONTROLS}, got {cfg.control!r}.")
    flushing = not cfg.keep_denormals and torch.set_flush_denormal(True)
    try:
        return _train(cfg, command)
    finally:
        if flushing:
            torch.set_flush_denormal(False)


def load_policy(spec: str, model_size: str, seed: int):
    """``(model, tokenizer)`` for ``--model``: the embedded tiny model (``model_size``) or :func:`load_agent`'s."""
    if spec == "tiny":
        spec = "tiny" if model_size == "tiny" else "tiny-small"
    agent = load_agent(spec, model_seed=seed)
    return agent.model, agent.tokenizer


def build_env(tokenizer, name: str, env_config: str | None, defaults: dict):
    """The env of ``--env`` with ``--env-config`` (JSON) or, without one, ``defaults``."""
    config = json.loads(env_config) if env_config else defaults
    if not isinstance(config, dict):
        raise ValueError(f"--env-config must be a JSON object, got {env_config!r}.")
    return get_env_class(name)(tokenizer, config)


def load_task_rows(path: str):
    """Task rows from ``--tasks`` / ``--eval-tasks-path``: a .json/.jsonl file, or what
    :func:`hf_rollouts.sources.load_dataset_source` reads (a save_to_disk folder, parquet)."""
    from datasets import load_dataset

    from hf_rollouts.sources import load_dataset_source

    if path.endswith((".json", ".jsonl")):
        return load_dataset("json", data_files=path, split="train")
    return load_dataset_source(path)


def _train(cfg: TrainConfig, command: str | None) -> list[IterationStats]:
    started, cpu_started = time.perf_counter(), time.process_time()
    accelerator = Accelerator()
    out = Path(cfg.output_dir)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_policy(cfg.model, cfg.model_size, cfg.seed)
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
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    train_model, optimizer = accelerator.prepare(model, optimizer)
    toy = {"low": cfg.low, "high": cfg.high, "max_turns": cfg.max_turns} if cfg.env == "guess_number" else {}
    env = None if cfg.tasks and cfg.eval_tasks_path else build_env(tokenizer, cfg.env, cfg.env_config, toy)
    if cfg.tasks:
        all_tasks = load_task_rows(cfg.tasks)
    else:
        all_tasks = env.get_train_dataset(cfg.tasks_per_iter * cfg.iterations) if cfg.iterations else None
    if cfg.eval_tasks_path:
        eval_tasks = load_task_rows(cfg.eval_tasks_path)
        eval_tasks = eval_tasks.select(range(min(cfg.eval_tasks, len(eval_tasks)))) if cfg.eval_tasks else eval_tasks
    else:
        eval_tasks = env.get_eval_dataset(cfg.eval_tasks) if cfg.eval_tasks else None
    collator = RolloutCollator(tokenizer.pad_token_id, advantage=cfg.advantage)

    def heldout(tag: str) -> dict | None:
        if eval_tasks is None:
            return None
        model.eval()
        seed = derive_seed("train_grpo_eval", cfg.seed)  # the same rows and seeds at every evaluation
        result = evaluate_agent(eval_tasks, agent, cfg.eval_rollouts, seed=seed, cache_dir=out / "cache" / tag)
        shutil.rmtree(out / "cache" / tag, ignore_errors=True)
        if accelerator.is_main_process and not cfg.quiet:
            print(f"held-out ({tag}): {result.describe()}", flush=True)
        return result.as_dict()

    base = heldout("eval_before")
    history: list[IterationStats] = []
    for it in range(cfg.iterations):
        start = time.perf_counter()
        model.eval()
        probe_before = agent.fingerprint()["weights_probe"]
        rollouts = generate_rollouts(
            _task_slice(all_tasks, it, cfg.tasks_per_iter),
            agent,
            cfg.num_rollouts,
            seed=iteration_seed(cfg.seed, it),
            cache_dir=out / "cache" / f"iter{it:04d}",
            load_from_cache_file=False,
            progress=False,
        )
        gen_done = time.perf_counter()
        saved = out / "rollouts" / f"iter{it:04d}"
        if accelerator.is_main_process:
            save_rollouts(rollouts, saved, overwrite=True)  # this run's own scratch directory
        accelerator.wait_for_everyone()
        with accelerator.main_process_first():
            prepared = prepare_rollouts(
                saved, flatten=True, advantage=cfg.advantage, drop_constant_groups=not cfg.keep_constant_groups
            )
        report = prepared.report
        dataset = prepared.dataset
        if cfg.control == "shuffle" and len(dataset):
            dataset = shuffle_advantages(dataset, derive_seed("train_grpo_control", cfg.seed, it))
        rewards = [r for row in rollouts["final_rewards"] for r in row if r is not None and math.isfinite(r)]
        statuses = [s for row in rollouts["statuses"] for s in row]
        calls = [c for row in rollouts["num_tool_calls"] for c in row]
        mean_reward = sum(rewards) / max(1, len(rewards))
        wins = [
            s == "done" and r is not None and r > 0
            for row_statuses, row_rewards in zip(rollouts["statuses"], rollouts["final_rewards"])
            for s, r in zip(row_statuses, row_rewards)
        ]
        solve_rate = sum(wins) / max(1, len(statuses) - statuses.count("error"))

        prep_done = time.perf_counter()
        losses, clips, kls, grad_norms = [], [], [], []
        if len(dataset):
            generator = torch.Generator().manual_seed(iteration_seed(cfg.seed, it))
            loader = DataLoader(
                dataset, batch_size=cfg.minibatch_size, shuffle=True, collate_fn=collator, generator=generator
            )
            loader = accelerator.prepare(loader)
            train_model.train()
            for _ in range(cfg.ppo_epochs):
                for batch in loader:
                    logprobs = token_logprobs(
                        train_model,
                        batch["input_ids"],
                        batch["attention_mask"],
                        cfg.temperature,
                        loss_mask=batch["loss_mask"],
                        share_prefix=cfg.share_prefix,
                    )
                    loss, metrics = grpo_loss(
                        logprobs, batch["old_logprobs"], batch["advantages"], batch["loss_mask"], clip_eps=cfg.clip_eps
                    )
                    accelerator.backward(loss)
                    grad_norms.append(float(accelerator.clip_grad_norm_(params, cfg.max_grad_norm)))
                    optimizer.step()
                    optimizer.zero_grad()
                    losses.append(metrics["loss"])
                    clips.append(metrics["clip_fraction"])
                    kls.append(metrics["approx_kl_old"])
        train_done = time.perf_counter()
        model.eval()
        changed = agent.fingerprint()["weights_probe"] != probe_before
        if losses and not changed:
            print(
                f"warning: iteration {it}: the agent fingerprint did not change after the update; the rollout cache "
                "could serve stale samples (this script also uses a per-iteration seed and cache dir).",
                file=sys.stderr,
            )
        if accelerator.is_main_process and not cfg.keep_rollouts:
            shutil.rmtree(out / "cache" / f"iter{it:04d}", ignore_errors=True)
            if it > 0:
                shutil.rmtree(out / "rollouts" / f"iter{it - 1:04d}", ignore_errors=True)
        last = it == cfg.iterations - 1
        due = last or (cfg.eval_every and (it + 1) % cfg.eval_every == 0)
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        stats = IterationStats(
            iteration=it,
            mean_reward=mean_reward,
            solve_rate=solve_rate,
            loss=mean(losses),
            trained_rollouts=report.rollouts_out,
            rollouts=report.rollouts_in,
            errors=report.errors,
            clip_fraction=mean(clips),
            approx_kl=mean(kls),
            grad_norm=mean(grad_norms),
            fingerprint_changed=changed,
            seconds=time.perf_counter() - start,
            phase_seconds={
                "generate": gen_done - start,
                "save_load": prep_done - gen_done,
                "update": train_done - prep_done,
            },
            tool_rate=sum(1 for c in calls if c) / max(1, len(calls)),
        )
        history.append(stats)
        if accelerator.is_main_process and not cfg.quiet:
            if it == 0:
                print(TABLE_HEADER, flush=True)
            print(format_row(stats), flush=True)
        if due:
            stats.heldout = heldout(f"eval_{it:04d}")
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps([dataclasses.asdict(s) for s in history], indent=1))
        summary = {
            "command": command,
            "config": dataclasses.asdict(cfg),
            "heldout_before": base,
            "heldout_after": history[-1].heldout if history else base,
            "heldout_curve": [{"iteration": s.iteration, **s.heldout} for s in history if s.heldout],
            "steps": [steps_row(s) for s in history],
            "wall_seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu_started,
            "torch_threads": torch.get_num_threads(),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        plot = cfg.plot if cfg.plot is not None else str(out / "learning_curve.png")
        if plot.lower() != "none" and history:
            save_plot(history, Path(plot), cfg, base)
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
        f"{num(s.grad_norm, 9, 4)} | "
        f"{s.trained_rollouts:>3}/{s.rollouts:<3} | {num(s.clip_fraction, 5, 3)} | {s.seconds:>5.1f}"
    )


def save_plot(history: list[IterationStats], path: Path, cfg: TrainConfig, base: dict | None = None) -> bool:
    """Write the learning curve PNG (with the held-out evaluations and their 95% intervals when there are any;
    ``base`` is the one before training, drawn at iteration -1); returns False (with a message) when matplotlib is
    missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            f"matplotlib is not installed: skipping {path}. Install it with `pip install 'hf_rollouts[plot]'`.",
            file=sys.stderr,
        )
        return False
    its = [s.iteration for s in history]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(its, [s.mean_reward for s in history], marker="o", label="mean reward")
    top.plot(its, [s.solve_rate for s in history], linestyle="--", label="solve rate")
    if any(s.tool_rate for s in history):
        top.plot(its, [s.tool_rate for s in history], linestyle=":", label="tool-call rate")
    points = ([(-1, base)] if base else []) + [(s.iteration, s.heldout) for s in history if s.heldout]
    if points:
        xs, evals = [p[0] for p in points], [p[1] for p in points]
        ys = [e["success"] for e in evals]
        errors = [[y - e["low"] for y, e in zip(ys, evals)], [e["high"] - y for y, e in zip(ys, evals)]]
        top.errorbar(xs, ys, yerr=errors, fmt="s", color="black", capsize=3, label="held-out success (95% CI)")
    top.set_ylabel("reward / solve rate")
    top.set_ylim(-0.02, 1.02)
    top.legend(loc="upper left", fontsize=8)
    env = (
        f"tasks {cfg.tasks}"
        if cfg.tasks
        else f"guess_number low={cfg.low} high={cfg.high} max_turns={cfg.max_turns}"
        if cfg.env == "guess_number" and not cfg.env_config
        else f"{cfg.env} {cfg.env_config or ''}"
    )
    control = ", CONTROL: advantages shuffled in groups" if cfg.control == "shuffle" else ""
    top.set_title(
        f"GRPO, {cfg.model}, {env}, {cfg.tasks_per_iter}x{cfg.num_rollouts} rollouts/iter, seed {cfg.seed}{control}",
        fontsize=8,
    )
    bottom.plot(its, [s.loss for s in history], marker=".", color="tab:red")
    bottom.set_ylabel("GRPO loss")
    bottom.set_xlabel("iteration")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"saved learning curve to {path}")
    return True


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The flags of :class:`TrainConfig` (transformers' ``HfArgumentParser``, as the CLI builds its own)."""
    (cfg,) = HfArgumentParser(TrainConfig, description=__doc__.split("\n\n")[0]).parse_args_into_dataclasses(argv)
    return cfg


def main(argv: list[str] | None = None) -> int:
    import datasets
    import transformers

    datasets.disable_progress_bars()  # the table is this script's output
    transformers.utils.logging.disable_progress_bar()
    import shlex

    argv = sys.argv[1:] if argv is None else argv
    history = train(parse_args(argv), command=shlex.join(["python", "scripts/train_grpo.py", *argv]))
    if not history:  # --iterations 0: the held-out evaluation alone (a base rate)
        return 0
    first, last = history[0], history[-1]
    if PartialState().is_main_process:
        print(
            f"mean reward: {first.mean_reward:.4f} (iteration 0) -> {last.mean_reward:.4f} (iteration {last.iteration})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
