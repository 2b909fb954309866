"""GRPO on an hf_rollouts environment with the library's loop pieces (default: the toy guess-the-number).

Each iteration collects rollouts of the current policy (:func:`hf_rollouts.rounds.collect_rollouts`: a fresh
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

**vLLM samples** (``--backend vllm``, in the vLLM venv: ``bash scripts/setup_vllm.sh``): the policy's starting
weights are saved to a temporary directory, an in-process :class:`~hf_rollouts.agents.vllm.VLLMAgent` (float32,
``processed`` log-probs, the trainer's convention) plays every round and the held-out evaluations, and after each
update ``agent.sync_weights(model)`` loads the trained weights into it. ``--kv-cache-gib`` sizes its KV cache (the
rest of the memory is the trainer's); ``--logprob-gap`` measures each round's sampler/trainer gap;
``--importance-sampling-cap C`` turns on truncated importance sampling in the update. Each row of ``metrics.json``
times its phases (``collect``, ``update``: prepare + ``grpo_update``, ``sync``, ``gap``). One process only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, PartialState

from hf_rollouts import recipes, training
from hf_rollouts.agents.vllm.weights import weights_probe
from hf_rollouts.evaluation import evaluation_of
from hf_rollouts.recipes import runs
from hf_rollouts.rounds import collect_rollouts
from hf_rollouts.seeding import derive_seed

BACKENDS = ("transformers", "vllm")
LR_HELP = "AdamW learning rate (1e-2 suits the tiny model; 3e-5 for SmolLM2)."
Run = runs.with_defaults(runs.RunOptions, helps={"lr": LR_HELP}, output_dir="outputs/train_grpo")


@dataclass
class TrainConfig(Run, runs.TaskFileOptions, runs.RoundOptions):
    """Settings of :func:`train`; every field is a ``--flag`` of the script."""

    ppo_epochs: int = runs.flag(1, "Passes over each iteration's rollouts.")
    advantage: str = runs.flag("grpo", f"One of {training.ADVANTAGE_MODES}.")
    keep_constant_groups: bool = runs.flag(False, "Train on groups with zero reward variance too.")
    model_size: str = runs.flag("tiny", "build_tiny_model size: tiny or small.")
    eval_every: int = runs.flag(0, "Also evaluate every N iterations (0: before and after).")
    share_prefix: bool = runs.flag(False, "Run the tokens every row of a minibatch begins with once.")
    keep_rollouts: bool = runs.flag(False, "Save every iteration's rollouts under OUTPUT_DIR/rollouts.")
    keep_denormals: bool = runs.flag(
        False, "Do not flush float32 denormals (the tiny model is 10-20x slower with them)."
    )
    backend: str = runs.flag("transformers", f"Who samples the rounds: one of {BACKENDS} (vllm: the vLLM venv).")
    kv_cache_gib: float = runs.flag(
        1.0,
        "--backend vllm: the engine's KV cache in GiB (kv_cache_memory_bytes; VLLM_CPU_KVCACHE_SPACE wins when set).",
    )
    logprob_gap: bool = runs.flag(False, "Measure each round's sampler/trainer log-prob gap (one more forward pass).")
    importance_sampling_cap: float | None = runs.flag(
        None, "Truncated importance sampling in the update, capped here (UpdateConfig.importance_sampling_cap)."
    )


def train(cfg: TrainConfig, command: str | None = None) -> list[runs.IterationStats]:
    """Run GRPO as the module docstring says; one :class:`~hf_rollouts.recipes.runs.IterationStats` per iteration
    (``command`` goes to ``summary.json``)."""
    if cfg.advantage not in training.ADVANTAGE_MODES or cfg.control not in runs.CONTROLS:
        raise ValueError(f"--advantage must be one of {training.ADVANTAGE_MODES}, --control of {runs.CONTROLS}.")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {BACKENDS}, got {cfg.backend!r}.")
    with training.flush_denormals(not cfg.keep_denormals), contextlib.ExitStack() as cleanup:
        return _train(cfg, command, cleanup)


def _train(cfg: TrainConfig, command: str | None, cleanup: contextlib.ExitStack) -> list[runs.IterationStats]:
    started, accelerator, out = (time.perf_counter(), time.process_time()), Accelerator(), Path(cfg.output_dir)
    spec = "tiny-small" if cfg.model == "tiny" and cfg.model_size != "tiny" else cfg.model
    model, tokenizer, agent, params = runs.load_policy(cfg, spec=spec, device=accelerator.device, suffix="grpo")
    if cfg.backend == "vllm":
        if accelerator.num_processes > 1:
            raise ValueError("--backend vllm runs in one process (the engine and the trainer share it).")
        agent = vllm_agent(model, tokenizer, cfg)
        cleanup.callback(agent.close)  # the engine's processes end with the run, also when it fails
    policy, optimizer = accelerator.prepare(model, torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0))
    all_tasks, eval_tasks = recipes.task_splits(
        tokenizer, env=cfg.env, env_config=runs.env_config_of(cfg), tasks=cfg.tasks, eval_tasks=cfg.eval_tasks_path,
        num_train=cfg.tasks_per_iter * cfg.iterations, num_eval=cfg.eval_tasks)  # fmt: skip
    update = training.UpdateConfig(cfg.minibatch_size, cfg.ppo_epochs, cfg.clip_eps, 0.0, cfg.max_grad_norm,
                                   cfg.share_prefix, importance_sampling_cap=cfg.importance_sampling_cap)  # fmt: skip
    main = accelerator.is_main_process
    base, history = runs.heldout(eval_tasks, agent, cfg, "eval_before", show=main), []
    for it in range(cfg.iterations):
        start, seed = time.perf_counter(), derive_seed("train_grpo", cfg.seed, it)
        probe, phases, gap = weights_probe(model), {}, None
        tasks = all_tasks.select([(it * cfg.tasks_per_iter + j) % len(all_tasks) for j in range(cfg.tasks_per_iter)])
        rollouts = collect_rollouts(tasks, agent, cfg.num_rollouts, seed=seed)
        phases["collect"] = time.perf_counter() - start
        if cfg.keep_rollouts and main:
            rollouts.save_to_disk(str(out / "rollouts" / f"iter{it:04d}"))
        began = time.perf_counter()
        with accelerator.main_process_first():
            prepared = training.prepare_rollouts(rollouts, flatten=True, advantage=cfg.advantage, progress=False,
                                                 drop_constant_groups=not cfg.keep_constant_groups)  # fmt: skip
        rows = prepared.dataset
        if cfg.control == "shuffle":
            rows = training.shuffle_advantages(rows, derive_seed("train_grpo_control", cfg.seed, it))
        phases["update"] = time.perf_counter() - began  # prepare (+ the control's shuffle), then grpo_update below
        played = evaluation_of(rollouts)
        if cfg.logprob_gap:
            began = time.perf_counter()
            every = training.prepare_rollouts(rollouts, flatten=True, progress=False).dataset
            gap = dataclasses.asdict(training.logprob_gap(model, every, tokenizer.pad_token_id))
            phases["gap"] = time.perf_counter() - began
        began = time.perf_counter()
        m = training.grpo_update(policy, optimizer, dataclasses.replace(prepared, dataset=rows),  # warns on a wasted
                                 pad_token_id=tokenizer.pad_token_id, config=update, seed=seed,  # round (the report)
                                 accelerator=accelerator)  # fmt: skip
        phases["update"] += time.perf_counter() - began
        if cfg.backend == "vllm":
            began = time.perf_counter()
            agent.sync_weights(model)  # the next round samples the updated policy
            phases["sync"] = time.perf_counter() - began
        after = weights_probe(model)
        changed = after != probe and agent.fingerprint().get("weights_probe") == after  # the sampler has them
        if m.steps and not changed:
            print(f"warning: iteration {it}: the weights probe did not move with the update.", file=sys.stderr)
        report = prepared.report
        stats = runs.IterationStats(it, played.mean_reward, played.success, m.loss, report.rollouts_out,
                               report.rollouts_in, report.errors, m.clip_fraction, m.approx_kl, m.grad_norm, changed,
                               time.perf_counter() - start, played.tool_rate, phases=phases,
                               logprob_gap=gap)  # fmt: skip
        history.append(stats)
        if main and not cfg.quiet:
            print(("" if it else runs.TABLE_HEADER + "\n") + runs.format_row(stats), flush=True)
        if it == cfg.iterations - 1 or (cfg.eval_every and (it + 1) % cfg.eval_every == 0):
            stats.heldout = runs.heldout(eval_tasks, agent, cfg, f"eval_{it:04d}", show=main)
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps([dataclasses.asdict(s) for s in history], indent=1))
        curve = [{"iteration": s.iteration, **s.heldout} for s in history if s.heldout]
        steps = [{"step": s.iteration + 1, "reward": s.mean_reward, "success": s.solve_rate, "tool_rate": s.tool_rate}
                 for s in history]  # fmt: skip
        recipes.write_summary(out, command=command, config=dataclasses.asdict(cfg), steps=steps, started=started,
                               heldout_before=base, heldout_after=history[-1].heldout if history else base,
                               heldout_curve=curve)  # fmt: skip
        plot = cfg.plot if cfg.plot is not None else str(out / "learning_curve.png")
        if plot.lower() != "none" and history:
            rounds = [{"x": s.iteration, "reward": s.mean_reward, "solve rate": s.solve_rate,
                       "tool_rate": s.tool_rate, "loss": s.loss} for s in history]  # fmt: skip
            points = ([(-1, base)] if base else []) + [(s.iteration, s.heldout) for s in history if s.heldout]
            control = ", CONTROL: advantages shuffled" if cfg.control == "shuffle" else ""
            title = f"GRPO, {cfg.model}, {cfg.tasks or cfg.env}, {cfg.tasks_per_iter}x{cfg.num_rollouts}/iter{control}"
            curves = ("reward", "solve rate", "tool_rate")
            recipes.save_learning_curve(plot, rounds, heldout=points, title=title, curves=curves)
    return history


def vllm_agent(model: Any, tokenizer: Any, cfg: TrainConfig) -> Any:
    """A :class:`~hf_rollouts.agents.vllm.VLLMAgent` on ``model``'s current weights (saved with ``tokenizer`` to a
    temporary directory the engine loads; removed when the engine has them), sampling as the script's transformers
    agent would: float32, ``processed`` log-probs at ``--temperature``, ``--max-new-tokens`` a turn, ``--seed``."""
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.agents.vllm import VLLMAgent

    with tempfile.TemporaryDirectory(prefix="train_grpo_policy_") as path:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return VLLMAgent(
            model=path, dtype="float32", logprobs_mode="processed", seed=cfg.seed, tokenizer=tokenizer,
            engine_kwargs={"kv_cache_memory_bytes": int(cfg.kv_cache_gib * (1 << 30))},
            sampling=SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
        )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The flags of :class:`TrainConfig`."""
    return runs.parse_options(TrainConfig, argv, __doc__.split("\n\n")[0])


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
