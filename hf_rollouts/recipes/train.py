"""The GRPO run of our loop: what ``hf-rollouts train CONFIG`` and ``scripts/train_grpo.py`` run.

Each round collects rollouts of the current policy (:func:`hf_rollouts.rounds.collect_rollouts`: a fresh seed, never
a cache replay), prepares them (:func:`~hf_rollouts.training.prepare_rollouts`: GRPO advantages, error and constant
groups dropped and counted) and takes one GRPO update (:func:`~hf_rollouts.training.grpo_update`), then prints a
table row; held-out evaluations use :func:`hf_rollouts.evaluation.evaluate_agent`. ``metrics.json`` (a row per round,
rewritten after each), ``summary.json`` and the learning curve go to ``output_dir``.

Around the loop (options: :class:`~.train_config.TrainConfig`):

* ``--backend vllm``: an in-process :class:`~hf_rollouts.agents.vllm.VLLMAgent` samples; after each update
  ``agent.sync_weights(model)`` loads the trained weights into it (:func:`vllm_agent`). ``--backend
  vllm-server``: a vLLM server of the run's own samples over HTTP, its weights reloaded the same way
  (:mod:`.served`).
* ``--max-staleness N``: overlapped rounds (:mod:`.overlap`), with any backend, checkpoints and resume.
* ``--lora-rank R``: peft's LoRA on every linear layer; only the adapter trains (and is checkpointed), and the
  sampling agent, which holds the same model object, samples with it. With ``--backend vllm`` the engine is built
  on the base weights with LoRA on, and each sync hands it the adapter alone (``agent.sync_adapter``: a new
  ``LoRARequest`` per version; the base weights are never reloaded).
* ``--checkpoint-every N`` / ``--resume``: :mod:`.checkpoint`; a resumed run loads the newest complete checkpoint
  (weights or adapter, optimizer, RNG states, round, data position, metrics so far) before the engine is built, so
  the engine starts on the restored weights, and goes on from the next round: its metrics are the uninterrupted
  run's (tests/test_train_command.py compares them, timings aside).
* ``--report-to trackio``: :mod:`.tracking`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import training
from ..evaluation import evaluation_of
from ..rounds import collect_rollouts
from ..seeding import derive_seed
from . import checkpoint as ckpt
from . import runs
from .overlap import RoundSteps, play_overlapped
from .report import save_learning_curve, write_summary
from .splits import task_splits
from .tracking import open_tracker, rollout_table, round_metrics
from .train_config import ENGINES, TrainConfig, TrainConfigError, check_config, resume_mismatches


@dataclass
class RunParts:
    """What a run holds between rounds."""

    cfg: TrainConfig
    accelerator: Any
    model: Any
    tokenizer: Any
    agent: Any
    policy: Any
    optimizer: Any
    raw_optimizer: Any
    all_tasks: Any
    eval_tasks: Any
    update: Any
    out: Path
    start: int = 0
    history: list = dataclasses.field(default_factory=list)
    base: dict | None = None
    tracker: Any = None
    started: tuple[float, float] = (0.0, 0.0)
    """``(perf_counter, process_time)`` when this process started the run (a resumed run: when it resumed)."""
    resumed_from: Path | None = None
    """The checkpoint folder a resumed run loaded."""
    overlap: Any = None
    """The :class:`~.overlap.Overlap` of overlapped rounds while they run (``--max-staleness N``)."""


def train(cfg: TrainConfig, command: str | None = None) -> list[runs.IterationStats]:
    """Run GRPO as the module docstring says; one :class:`~hf_rollouts.recipes.runs.IterationStats` per round (a
    resumed run's list holds the rounds before the checkpoint too). ``command`` goes to ``summary.json``."""
    check_config(cfg)
    with training.flush_denormals(not cfg.keep_denormals), contextlib.ExitStack() as cleanup:
        started = (time.perf_counter(), time.process_time())
        parts = setup(cfg, cleanup)
        parts.started = started
        if cfg.max_staleness:
            play_overlapped(parts, ROUND_STEPS)
            last = parts.history[-1].iteration if parts.history else -1
            if cfg.stop_after_round is None or last < cfg.stop_after_round:
                finish(parts, command)
            return parts.history
        for it in range(parts.start, cfg.iterations):
            play_round(parts, it)
            if cfg.stop_after_round is not None and it >= cfg.stop_after_round:
                return parts.history  # as if killed right after this round's checkpoint
        finish(parts, command)
        return parts.history


def add_lora(model: Any, rank: int, alpha: float | None) -> tuple[Any, list]:
    """``(peft model, its trainable parameters)``: LoRA of ``rank`` on every linear layer of ``model`` (peft's
    ``all-linear``: the output layer left out), no dropout; ``model``'s modules are changed in place, so an agent
    holding ``model`` samples with the adapter."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise ImportError("--lora-rank needs peft: pip install 'hf_rollouts[lora]' (or 'peft==0.21.*').") from exc
    config = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules="all-linear", lora_dropout=0.0,
                        task_type="CAUSAL_LM")  # fmt: skip
    peft_model = get_peft_model(model, config)
    return peft_model, [p for p in peft_model.parameters() if p.requires_grad]


def warn_inherited_precision(mixed_precision: str) -> None:
    """Warn when the run's ``Accelerator()`` trains under mixed precision nobody asked this run for: accelerate's state
    is process-wide, so a TRL ``GRPOTrainer`` built earlier in the process (``GRPOConfig`` defaults to bf16) makes every
    later ``Accelerator()`` autocast in bf16. Asked for means ``accelerate launch --mixed_precision`` (its
    ``ACCELERATE_MIXED_PRECISION`` variable)."""
    import os
    import warnings

    if mixed_precision != "no" and os.environ.get("ACCELERATE_MIXED_PRECISION", "no") != mixed_precision:
        warnings.warn(
            f"this process's accelerate state already holds mixed_precision={mixed_precision!r} (set by another "
            "library before this run, e.g. a TRL GRPOTrainer: GRPOConfig defaults to bf16), so the run trains under "
            f"{mixed_precision} autocast; run it in a fresh process for float32, or launch it with "
            f"`accelerate launch --mixed_precision {mixed_precision}` to mean it.",
            stacklevel=3,
        )


def setup(cfg: TrainConfig, cleanup: contextlib.ExitStack) -> RunParts:
    """The policy, its optimizer, the sampling agent, the task rows, and a resumed run's state."""
    import torch
    from accelerate import Accelerator

    accelerator, out = Accelerator(), Path(cfg.output_dir or ".")
    warn_inherited_precision(accelerator.mixed_precision)
    spec = "tiny-small" if cfg.model == "tiny" and cfg.model_size != "tiny" else cfg.model
    model, tokenizer, agent, params = runs.load_policy(cfg, spec=spec, device=accelerator.device, suffix="grpo")
    trained, engine = model, None
    if cfg.backend == "vllm" and cfg.lora_rank and accelerator.num_processes == 1:  # the base weights, unwrapped
        engine = vllm_agent(model, tokenizer, cfg)
        cleanup.callback(engine.close)
    if cfg.lora_rank:
        trained, params = add_lora(model, cfg.lora_rank, cfg.lora_alpha)
    raw_optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    found = None
    if cfg.resume:
        found = ckpt.latest_checkpoint(out / "checkpoints")
        if found is None:
            raise TrainConfigError(f"--resume: no complete checkpoint under {out / 'checkpoints'}; run without "
                                   "--resume (and with --checkpoint-every N) first.")  # fmt: skip
        wrong = resume_mismatches(found.state["config"], cfg)
        if wrong:
            raise TrainConfigError(f"--resume: {found.path} is of another run ({'; '.join(wrong)}): resume with "
                                   "its options or use another --output-dir.")  # fmt: skip
        ckpt.load_weights(found, trained, raw_optimizer, adapter=bool(cfg.lora_rank))
    if cfg.backend in ENGINES:
        if accelerator.num_processes > 1:
            raise TrainConfigError(f"--backend {cfg.backend} runs in one process (one sampler for the trainer).")
        if engine is not None:
            engine.sync_adapter(trained)  # version 1: the fresh (or resumed) adapter
            agent = engine
        elif cfg.backend == "vllm":
            agent = vllm_agent(model, tokenizer, cfg)  # after a resume's load: the engine starts on those weights
            cleanup.callback(agent.close)  # the engine's processes end with the run, also when it fails
        else:
            from .served import serve_policy

            agent = serve_policy(model, tokenizer, cfg, out)  # the server, too
            cleanup.callback(agent.close)
    policy, optimizer = accelerator.prepare(trained, raw_optimizer)
    all_tasks, eval_tasks = task_splits(
        tokenizer, env=cfg.env, env_config=runs.env_config_of(cfg), tasks=cfg.tasks, eval_tasks=cfg.eval_tasks_path,
        num_train=cfg.tasks_per_iter * cfg.iterations, num_eval=cfg.eval_tasks)  # fmt: skip
    update = training.UpdateConfig(cfg.minibatch_size, cfg.ppo_epochs, cfg.clip_eps, 0.0, cfg.max_grad_norm,
                                   cfg.share_prefix, importance_sampling_cap=cfg.importance_sampling_cap)  # fmt: skip
    parts = RunParts(cfg, accelerator, model, tokenizer, agent, policy, optimizer, raw_optimizer, all_tasks,
                     eval_tasks, update, out)  # fmt: skip
    main = accelerator.is_main_process
    if found is not None:
        state = found.state
        parts.start, parts.base, parts.resumed_from = state["round"] + 1, state["heldout_before"], found.path
        parts.history = [runs.IterationStats(**row) for row in state["history"]]
        if main and not cfg.quiet:
            print(f"resumed from {found.path}: rounds {parts.start}..{cfg.iterations - 1} to go", flush=True)
    if main and cfg.report_to != "none":
        parts.tracker = open_tracker(cfg.report_to, cfg.output_dir, cfg.run_name, dataclasses.asdict(cfg))
        cleanup.callback(parts.tracker.finish)
    if found is None:
        parts.base = runs.heldout(eval_tasks, agent, cfg, "eval_before", show=main)
        if parts.tracker is not None:
            parts.tracker.log_heldout(0, parts.base, "eval_before")
    return parts


def round_tasks(parts: RunParts, it: int) -> Any:
    """Round ``it``'s task rows: the next ``tasks_per_iter`` rows of the train rows, wrapping around (the data
    position of round ``it`` is ``it * tasks_per_iter``)."""
    n, total = parts.cfg.tasks_per_iter, len(parts.all_tasks)
    return parts.all_tasks.select([(it * n + j) % total for j in range(n)])


def round_seed(cfg: TrainConfig, it: int) -> int:
    """The seed of round ``it``'s collection and update."""
    return derive_seed("train_grpo", cfg.seed, it)


def play_round(parts: RunParts, it: int) -> runs.IterationStats:
    """Collect, prepare, update (and sync, evaluate, checkpoint, log) round ``it``."""
    start = time.perf_counter()
    tasks, seed = round_tasks(parts, it), round_seed(parts.cfg, it)
    rollouts = collect_rollouts(tasks, parts.agent, parts.cfg.num_rollouts, seed=seed)
    return train_round(parts, it, rollouts, {"collect": time.perf_counter() - start}, start)


def train_round(
    parts: RunParts, it: int, rollouts: Any, phases: dict, start: float, staleness: dict | None = None
) -> runs.IterationStats:
    """Prepare, update (and sync, evaluate, checkpoint, log) round ``it`` on its collected ``rollouts``; ``phases``
    holds the collection's seconds, ``start`` is when the round began (``perf_counter``), ``staleness`` goes to the
    round's stats (:mod:`.overlap`)."""
    from ..agents.hf.agent import weights_probe

    cfg, model, tokenizer, main = parts.cfg, parts.model, parts.tokenizer, parts.accelerator.is_main_process
    seed, probe, gap = round_seed(cfg, it), weights_probe(model), None
    if cfg.keep_rollouts and main:
        folder = parts.out / "rollouts" / f"iter{it:04d}"
        rollouts.save_to_disk(str(folder))
        tokenizer.save_pretrained(str(folder / "tokenizer"))  # what `hf-rollouts view` reads the tokens with
    began = time.perf_counter()
    with parts.accelerator.main_process_first():
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
    m = training.grpo_update(parts.policy, parts.optimizer, dataclasses.replace(prepared, dataset=rows),  # warns on a
                             pad_token_id=tokenizer.pad_token_id, config=parts.update, seed=seed,  # wasted round
                             accelerator=parts.accelerator)  # fmt: skip
    phases["update"] += time.perf_counter() - began
    if cfg.backend in ENGINES and parts.overlap is None:
        began = time.perf_counter()
        if cfg.lora_rank:  # the adapter alone: the engine keeps its base weights
            parts.agent.sync_adapter(parts.accelerator.unwrap_model(parts.policy))
        else:
            parts.agent.sync_weights(model)  # the next round samples the updated policy
        phases["sync"] = time.perf_counter() - began
    after = weights_probe(model)  # the sampler has them (overlapped: the collector loads them for a later round)
    changed = after != probe and (parts.overlap is not None or parts.agent.fingerprint().get("weights_probe") == after)
    if m.steps and not changed:
        print(f"warning: iteration {it}: the weights probe did not move with the update.", file=sys.stderr)
    report = prepared.report
    if gap is None and not math.isnan(m.logprob_gap_max):  # the update measured it (importance sampling on)
        gap = {"max_abs": m.logprob_gap_max, "mean_abs": m.logprob_gap_mean}
    importance = None
    if not math.isnan(m.sampling_weight_mean):
        importance = {"mean": m.sampling_weight_mean, "capped": m.sampling_weight_capped}
    tokens = sum(sum(map(sum, masks)) for masks in rollouts["padded_agent_token_mask"])
    stats = runs.IterationStats(it, played.mean_reward, played.success, m.loss, report.rollouts_out,
                                report.rollouts_in, report.errors, m.clip_fraction, m.approx_kl, m.grad_norm, changed,
                                time.perf_counter() - start, played.tool_rate, phases=phases, logprob_gap=gap,
                                groups={"total": report.groups_in, "kept": report.groups_out,
                                        "constant": report.constant_groups},
                                importance=importance, agent_tokens=int(tokens), staleness=staleness)  # fmt: skip
    parts.history.append(stats)
    if main and not cfg.quiet:
        print(("" if it else runs.TABLE_HEADER + "\n") + runs.format_row(stats), flush=True)
    evaluate = it == cfg.iterations - 1 or (cfg.eval_every and (it + 1) % cfg.eval_every == 0)
    if evaluate and parts.eval_tasks is not None:
        began = time.perf_counter()
        with parts.overlap.evaluation(model, it + 1) if parts.overlap else contextlib.nullcontext():
            stats.heldout = runs.heldout(parts.eval_tasks, parts.agent, cfg, f"eval_{it:04d}", show=main)
        phases["eval"] = time.perf_counter() - began  # a phase only where held-out rows were played (overlapped, on
        # one engine: with the wait for the round in flight and the engine's sync)
    if parts.tracker is not None:
        parts.tracker.log_round(it + 1, round_metrics(stats), rollout_table(rollouts, cfg.log_rollouts))
    if main:
        write_metrics(parts)
    every = cfg.checkpoint_every
    if every and ((it + 1) % every == 0 or it == cfg.iterations - 1):
        save_round(parts, it)
    return stats


def save_round(parts: RunParts, it: int) -> Path | None:
    """Round ``it``'s checkpoint (the main process writes it; every process waits for it)."""
    cfg, path = parts.cfg, None
    if parts.accelerator.is_main_process:
        state = {"config": dataclasses.asdict(cfg), "history": [dataclasses.asdict(s) for s in parts.history],
                 "heldout_before": parts.base, "data_position": (it + 1) * cfg.tasks_per_iter % len(parts.all_tasks),
                 "adapter": bool(cfg.lora_rank), "scheduler": None}  # fmt: skip
        model, overlap = parts.accelerator.unwrap_model(parts.policy), parts.overlap
        if overlap is not None:  # the versions the next rounds are sampled by (recipes/overlap.py)
            state["sampler_versions"] = overlap.checkpoint_versions(it)

        def write(folder: Path) -> None:
            ckpt.save_weights(folder, model, parts.raw_optimizer, adapter=bool(cfg.lora_rank))
            if overlap is not None:
                overlap.save_sampler(folder, it)

        path = ckpt.save_checkpoint(parts.out / "checkpoints", it, write, state, keep=cfg.keep_checkpoints)
    parts.accelerator.wait_for_everyone()
    return path


def write_metrics(parts: RunParts) -> None:
    parts.out.mkdir(parents=True, exist_ok=True)
    rows = json.dumps([dataclasses.asdict(s) for s in parts.history], indent=1)
    tmp = parts.out / "metrics.json.tmp"
    tmp.write_text(rows)
    tmp.replace(parts.out / "metrics.json")  # never half a file, also when the run is killed while writing


def finish(parts: RunParts, command: str | None) -> None:
    """``summary.json`` and the learning curve (main process)."""
    cfg, history, base, out = parts.cfg, parts.history, parts.base, parts.out
    if not parts.accelerator.is_main_process:
        return
    write_metrics(parts)
    curve = [{"iteration": s.iteration, **s.heldout} for s in history if s.heldout]
    steps = [{"step": s.iteration + 1, "reward": s.mean_reward, "success": s.solve_rate, "tool_rate": s.tool_rate}
             for s in history]  # fmt: skip
    write_summary(out, command=command, config=dataclasses.asdict(cfg), steps=steps,
                  started=parts.started,
                  heldout_before=base, heldout_after=history[-1].heldout if history else base,
                  heldout_curve=curve)  # fmt: skip
    plot = cfg.plot if cfg.plot is not None else str(out / "learning_curve.png")
    if plot.lower() != "none" and history:
        rounds = [{"x": s.iteration, "reward": s.mean_reward, "solve rate": s.solve_rate,
                   "tool_rate": s.tool_rate, "loss": s.loss} for s in history]  # fmt: skip
        points = ([(-1, base)] if base else []) + [(s.iteration, s.heldout) for s in history if s.heldout]
        control = ", CONTROL: advantages shuffled" if cfg.control == "shuffle" else ""
        title = f"GRPO, {cfg.model}, {cfg.tasks or cfg.env}, {cfg.tasks_per_iter}x{cfg.num_rollouts}/iter{control}"
        save_learning_curve(plot, rounds, heldout=points, title=title, curves=("reward", "solve rate", "tool_rate"))


def vllm_agent(model: Any, tokenizer: Any, cfg: TrainConfig) -> Any:
    """A :class:`~hf_rollouts.agents.vllm.VLLMAgent` on ``model``'s current weights (saved with ``tokenizer`` to a
    temporary directory the engine loads; removed when the engine has them), sampling as the run's transformers
    agent would: float32, ``processed`` log-probs at ``--temperature``, ``--max-new-tokens`` a turn, ``--seed``;
    with ``--lora-rank`` LoRA is on (:func:`~hf_rollouts.agents.vllm.lora_engine_kwargs`) and ``model`` must be the
    base model, before peft wraps it."""
    from ..agents.sampling import SamplingConfig
    from ..agents.vllm import VLLMAgent, lora_engine_kwargs

    lora = lora_engine_kwargs(cfg.lora_rank) if cfg.lora_rank else {}

    with tempfile.TemporaryDirectory(prefix="train_grpo_policy_") as path:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return VLLMAgent(
            model=path, dtype="float32", logprobs_mode="processed", seed=cfg.seed, tokenizer=tokenizer,
            engine_kwargs={"kv_cache_memory_bytes": int(cfg.kv_cache_gib * (1 << 30)), **lora},
            sampling=SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens),
        )  # fmt: skip


ROUND_STEPS = RoundSteps(round_tasks, round_seed, train_round)
"""The steps of a round :func:`~hf_rollouts.recipes.overlap.play_overlapped` calls (``--max-staleness N``)."""

__all__ = ["ROUND_STEPS", "RunParts", "TrainConfig", "add_lora", "play_round", "round_seed", "round_tasks", "setup",
           "train", "train_round", "vllm_agent"]  # fmt: skip
