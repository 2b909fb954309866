"""GRPO with TRL's ``GRPOTrainer`` on an hf_rollouts environment, through ``hf_rollouts.integrations.trl``.

The default task is the toy ``GuessNumberEnv`` with ``low == high == 3`` and two turns: the prompt
is "Guess the number between 3 and 3. Answer with one number."; a wrong answer gets a hint and a
second try. The randomly initialised tiny model almost never writes a 3, so the reward (1 when the
number is named, else 0) starts near 0; GRPO raises it. Runs on CPU in about a minute::

    python scripts/train_trl.py                      # tiny model, CPU
    python scripts/train_trl.py --max-steps 40 --lr 5e-3

With a vLLM server (``trl vllm-serve --model MODEL --logprobs-mode processed_logprobs``) the agent
turns are sampled by TRL's vLLM client::

    python scripts/train_trl.py --model MODEL --use-vllm

It prints one line per optimizer step (TRL's logged ``reward``: the mean env reward of the
episodes that step trained on, sampled before its update) and the first-vs-last summary.
``train(TrainConfig(...))`` is importable and returns the per-step rows.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@dataclass
class TrainConfig:
    """Settings of :func:`train`; every field is a ``--flag``."""

    max_steps: int = field(default=30, metadata={"help": "Optimizer steps (one rollout call each)."})
    seed: int = field(default=0, metadata={"help": "Seeds the model init (tiny) and TRL's sampling."})
    model: str = field(default="tiny", metadata={"help": "'tiny' (the embedded model) or a model id/path."})
    num_generations: int = field(default=8, metadata={"help": "Episodes per task (the GRPO group size)."})
    tasks_per_step: int = field(default=4, metadata={"help": "Task groups per optimizer step."})
    lr: float = field(default=3e-2, metadata={"help": "AdamW learning rate, constant (3e-2 suits the tiny model)."})
    low: int = field(default=3, metadata={"help": "GuessNumberEnv low."})
    high: int = field(default=3, metadata={"help": "GuessNumberEnv high (== low: a fixed answer to learn)."})
    max_turns: int = field(default=2, metadata={"help": "GuessNumberEnv max_turns."})
    max_new_tokens: int = field(default=3, metadata={"help": "Token budget of one agent turn."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (TRL's, also for log-probs)."})
    fp32: bool = field(
        default=False,
        metadata={
            "help": "On a GPU, train without bf16 autocast: the trainer's recomputed log-probs then agree with the "
            "sampler's to float32 precision (~1e-6; under bf16 autocast ~1e-2 max; scripts/logprob_agreement.py)."
        },
    )
    use_vllm: bool = field(default=False, metadata={"help": "Sample with TRL's vLLM server client."})
    vllm_server_base_url: str | None = field(default=None, metadata={"help": "vLLM server URL (with --use-vllm)."})
    output_dir: str | None = field(default=None, metadata={"help": "TRL output dir (default: a temp dir)."})
    quiet: bool = field(default=False, metadata={"help": "Do not print the table."})


def build(cfg: TrainConfig):
    """``(trainer, rollout_func)`` for ``cfg``: the GRPOTrainer wired to hf_rollouts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from hf_rollouts.envs.guess_number import GuessNumberEnv
    from hf_rollouts.integrations.trl import env_reward, make_rollout_func, to_trl_dataset
    from hf_rollouts.tiny_model import build_tiny_model

    if cfg.model == "tiny":
        model, tokenizer = build_tiny_model(seed=cfg.seed)
    else:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype="auto")
    on_cpu = not torch.cuda.is_available()
    env = GuessNumberEnv(tokenizer, {"low": cfg.low, "high": cfg.high, "max_turns": cfg.max_turns})
    tasks = env.get_train_dataset(cfg.tasks_per_step * cfg.max_steps)
    args = GRPOConfig(
        output_dir=cfg.output_dir or tempfile.mkdtemp(prefix="train_trl_"),
        max_steps=cfg.max_steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        num_generations=cfg.num_generations,
        per_device_train_batch_size=cfg.tasks_per_step * cfg.num_generations,
        temperature=cfg.temperature,
        seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=on_cpu,
        bf16=not on_cpu and not cfg.fp32,
        gradient_checkpointing=False,  # with True it also works: generation lifts it (pitfall 1)
        use_vllm=cfg.use_vllm,
        vllm_mode="server",
        vllm_server_base_url=cfg.vllm_server_base_url,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    rollout_func = make_rollout_func(max_new_tokens=cfg.max_new_tokens)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=to_trl_dataset(tasks),
        reward_funcs=[env_reward],
        rollout_func=rollout_func,
    )
    trainer.remove_callback(PrinterCallback)  # this script prints its own table
    return trainer, rollout_func


@dataclass
class StepRow:
    step: int
    reward: float
    reward_std: float
    frac_reward_zero_std: float
    grad_norm: float
    agent_tokens: float


def train(cfg: TrainConfig) -> list[StepRow]:
    """Train and return one :class:`StepRow` per optimizer step (from ``trainer.state.log_history``)."""
    import torch

    flushing = torch.set_flush_denormal(True)  # the tiny model hits float32 denormals: 10-20x slower on x86
    try:
        trainer, _ = build(cfg)
        trainer.train()
    finally:
        if flushing:
            torch.set_flush_denormal(False)
    rows = []
    for h in trainer.state.log_history:
        if "reward" in h:
            rows.append(
                StepRow(
                    step=int(h["step"]),
                    reward=h["reward"],
                    reward_std=h.get("reward_std", math.nan),
                    frac_reward_zero_std=h.get("frac_reward_zero_std") or 0.0,
                    grad_norm=h.get("grad_norm") or 0.0,
                    agent_tokens=h.get("completions/mean_length") or 0.0,
                )
            )
    return rows


def format_table(rows: list[StepRow]) -> str:
    lines = [
        f"{'step':>4} | {'reward':>6} | {'std':>5} | {'zero-std groups':>15} | {'grad_norm':>9} | {'agent tok':>9}"
    ]
    for r in rows:
        bar = "#" * round(20 * max(0.0, min(1.0, r.reward)))
        lines.append(
            f"{r.step:>4} | {r.reward:>6.3f} | {r.reward_std:>5.2f} | {r.frac_reward_zero_std:>15.2f} | "
            f"{r.grad_norm:>9.3f} | {r.agent_tokens:>9.2f} {bar}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The flags of :class:`TrainConfig` (transformers' ``HfArgumentParser``, as the CLI builds its own)."""
    from transformers import HfArgumentParser

    (cfg,) = HfArgumentParser(TrainConfig, description=__doc__.split("\n\n")[0]).parse_args_into_dataclasses(argv)
    return cfg


def main(argv: list[str] | None = None) -> int:
    import importlib.util
    import warnings

    import datasets
    import transformers

    if importlib.util.find_spec("trl") is None:
        print("This script needs TRL: pip install 'hf_rollouts[trl]'  (trl>=1.16,<2)")
        return 1
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    cfg = parse_args(argv)
    rows = train(cfg)
    if not cfg.quiet:
        print(format_table(rows))
    k = max(1, len(rows) // 5)
    first = sum(r.reward for r in rows[:k]) / k
    last = sum(r.reward for r in rows[-k:]) / k
    print(f"mean reward: {first:.3f} (first {k} steps) -> {last:.3f} (last {k} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
