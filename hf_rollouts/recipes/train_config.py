"""The options of a GRPO run of our loop (:func:`hf_rollouts.recipes.train.train`, ``hf-rollouts train CONFIG``,
``scripts/train_grpo.py``): :class:`TrainConfig`, declared once, and :func:`check_config`, the checks made before any
work."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..training.advantages import ADVANTAGE_MODES
from . import runs

BACKENDS = ("transformers", "vllm", "vllm-server")
ENGINES = ("vllm", "vllm-server")
"""The backends whose sampler holds weights of its own, synced after each update."""
REPORT_TO = ("none", "trackio")
LR_HELP = "AdamW learning rate (1e-2 suits the tiny model; 3e-5 for SmolLM2)."
Run = runs.with_defaults(runs.RunOptions, helps={"lr": LR_HELP}, output_dir="outputs/train_grpo")


class TrainConfigError(ValueError):
    """A run's options that cannot work together (says which and how to fix it); refused before any work."""


@dataclass
class TrainConfig(Run, runs.TaskFileOptions, runs.RoundOptions):
    """Settings of :func:`~hf_rollouts.recipes.train.train`; every field is a ``--flag`` of ``scripts/train_grpo.py``
    and of ``hf-rollouts train``, and a key of its config file."""

    ppo_epochs: int = runs.flag(1, "Passes over each iteration's rollouts.")
    advantage: str = runs.flag("grpo", f"One of {ADVANTAGE_MODES}.")
    keep_constant_groups: bool = runs.flag(False, "Train on groups with zero reward variance too.")
    model_size: str = runs.flag("tiny", "build_tiny_model size: tiny or small.")
    eval_every: int = runs.flag(0, "Also evaluate every N iterations (0: before and after).")
    share_prefix: bool = runs.flag(False, "Run the tokens every row of a minibatch begins with once.")
    keep_rollouts: bool = runs.flag(
        False, "Save every iteration's rollouts under OUTPUT_DIR/rollouts (with the tokenizer: hf-rollouts view opens "
        "one).")  # fmt: skip
    keep_denormals: bool = runs.flag(
        False, "Do not flush float32 denormals (the tiny model is 10-20x slower with them)."
    )
    backend: str = runs.flag(
        "transformers", f"Who samples the rounds: one of {BACKENDS} (vllm: in this process, the vLLM venv; "
        "vllm-server: a vLLM server started with --server-python, recipes/served.py).")  # fmt: skip
    server_python: str | None = runs.flag(
        None, "--backend vllm-server: the Python whose vLLM serves the policy (default: this one; bash "
        "scripts/setup_vllm.sh --check prints the vLLM venv's).")  # fmt: skip
    kv_cache_gib: float = runs.flag(
        1.0,
        "--backend vllm / vllm-server: the engine's KV cache in GiB (kv_cache_memory_bytes; VLLM_CPU_KVCACHE_SPACE "
        "wins when set).",
    )
    logprob_gap: bool = runs.flag(False, "Measure each round's sampler/trainer log-prob gap (one more forward pass).")
    importance_sampling_cap: float | None = runs.flag(
        None, "Truncated importance sampling in the update, capped here (UpdateConfig.importance_sampling_cap)."
    )
    checkpoint_every: int = runs.flag(
        0, "Write a checkpoint every N rounds (and after the last) in OUTPUT_DIR/checkpoints (0: none).")  # fmt: skip
    keep_checkpoints: int = runs.flag(2, "Complete checkpoints kept (the oldest are removed).")
    resume: bool = runs.flag(
        False, "Resume from OUTPUT_DIR's newest complete checkpoint (a torn one is skipped, with a warning)."
    )
    stop_after_round: int | None = runs.flag(
        None, "Stop after this round's checkpoint, as if killed there: for testing --resume.")  # fmt: skip
    report_to: str = runs.flag(
        "none", f"One of {REPORT_TO}: also log each round to trackio (pip install 'hf_rollouts[trackio]'), in "
        "OUTPUT_DIR/trackio unless TRACKIO_DIR is set.")  # fmt: skip
    run_name: str | None = runs.flag(None, "The tracker's run name (default: OUTPUT_DIR's name).")
    log_rollouts: int = runs.flag(4, "--report-to: rollouts of each round logged as a table (0: none).")
    lora_rank: int = runs.flag(0, "Train a LoRA adapter of this rank (peft, every linear layer), not the weights.")
    lora_alpha: float | None = runs.flag(None, "LoRA alpha (default: 2 x --lora-rank).")
    max_staleness: int = runs.flag(
        0, "Overlapped rounds: collect round k+1 while round k trains, on rollouts at most this many updates old "
        "(0: the synchronous loop; needs --importance-sampling-cap; recipes/overlap.py).")  # fmt: skip


RESUME_MAY_CHANGE = frozenset(
    {"resume", "stop_after_round", "quiet", "plot", "report_to", "run_name", "log_rollouts", "keep_checkpoints",
     "checkpoint_every", "keep_rollouts", "output_dir"}
)  # fmt: skip
"""Options a resumed run may set otherwise than the run it resumes (they change what is written, not what is
trained); every other one must be the checkpoint's."""


def check_config(cfg: TrainConfig) -> None:
    """:class:`TrainConfigError` for options that cannot run, before any work."""
    choices = {"advantage": ADVANTAGE_MODES, "control": runs.CONTROLS, "backend": BACKENDS, "report_to": REPORT_TO}
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise TrainConfigError(f"--{name.replace('_', '-')} must be one of {allowed}, got {getattr(cfg, name)!r}.")
    if cfg.lora_rank < 0 or cfg.checkpoint_every < 0 or cfg.keep_checkpoints < 1:
        raise TrainConfigError("--lora-rank and --checkpoint-every must be >= 0 and --keep-checkpoints >= 1.")
    if cfg.lora_rank and cfg.trainable_layers:
        raise TrainConfigError("--lora-rank trains an adapter on every linear layer: leave --trainable-layers at 0.")
    if cfg.lora_rank > 512 and cfg.backend == "vllm":
        raise TrainConfigError(f"--lora-rank {cfg.lora_rank} with --backend vllm: vLLM serves LoRA ranks up to 512.")
    if cfg.lora_rank and cfg.backend == "vllm-server":
        raise TrainConfigError("--lora-rank with --backend vllm-server is not supported (the server would need the "
                               "adapter, not the weights): use --backend vllm or transformers.")  # fmt: skip
    if cfg.lora_rank and cfg.max_staleness and cfg.backend == "vllm":
        raise TrainConfigError("--lora-rank with --max-staleness N and --backend vllm is not supported yet (the "
                               "overlapped collector loads whole weights, not the adapter): use --max-staleness 0, "
                               "or --backend transformers.")  # fmt: skip
    if cfg.stop_after_round is not None and (
        not cfg.checkpoint_every or (cfg.stop_after_round + 1) % cfg.checkpoint_every
    ):
        raise TrainConfigError(
            "--stop-after-round R stops at round R's checkpoint: give --checkpoint-every N with N dividing R + 1."
        )
    if cfg.max_staleness < 0:
        raise TrainConfigError(f"--max-staleness must be >= 0 (0: the synchronous loop), got {cfg.max_staleness}.")
    if cfg.max_staleness and cfg.importance_sampling_cap is None:
        raise TrainConfigError("--max-staleness N trains on rollouts of an older policy: set --importance-sampling-cap "
                               "(e.g. 2.0) so the update weighs them against the trainer.")  # fmt: skip
    if cfg.resume and not cfg.output_dir:
        raise TrainConfigError("--resume needs --output-dir (the checkpoints are under OUTPUT_DIR/checkpoints).")


def resume_mismatches(saved: dict, cfg: TrainConfig) -> list[str]:
    """The options of ``cfg`` that differ from the checkpoint's ``saved`` config (``asdict`` of a
    :class:`TrainConfig`), but for :data:`RESUME_MAY_CHANGE`: ``["lr: 0.01 in the checkpoint, 0.02 now", ...]``."""
    now = dataclasses.asdict(cfg)
    return [f"{k}: {saved.get(k)!r} in the checkpoint, {v!r} now" for k, v in now.items()
            if k not in RESUME_MAY_CHANGE and saved.get(k) != v]  # fmt: skip


__all__ = ["BACKENDS", "ENGINES", "REPORT_TO", "RESUME_MAY_CHANGE", "TrainConfig", "TrainConfigError", "check_config",
           "resume_mismatches"]  # fmt: skip
