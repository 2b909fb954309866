"""GRPO with TRL's ``GRPOTrainer`` on an hf_rollouts env (:func:`hf_rollouts.integrations.trl.build_grpo_trainer`).

The default task is the toy ``GuessNumberEnv`` with ``low == high == 3`` and two turns (a wrong answer gets a hint
and a second try); the random tiny model almost never writes a 3, so the reward starts near 0 and GRPO raises it.
About a minute on CPU::

    python scripts/train_trl.py                      # tiny model, CPU
    python scripts/train_trl.py --model MODEL --use-vllm   # turns sampled by TRL's vLLM client
    # (trl vllm-serve --model MODEL --logprobs-mode processed_logprobs)

**A real model** (docs/guides/training.md), as ``scripts/train_grpo.py``: ``--model smollm2``, ``--env`` with
``--env-config`` JSON or ``--tasks PATH`` (task rows) with ``--eval-tasks-path PATH``, ``--eval-tasks N`` held-out
rows evaluated before and after (95% Wilson interval), ``--control shuffle`` (rewards shuffled within groups) and
``--trainable-layers K``::

    python scripts/train_trl.py --model smollm2 --env arithmetic --eval-tasks 160 --max-steps 80 \\
        --steps-per-generation 4 --tasks-per-step 8 --num-generations 8 --lr 3e-5 --temperature 0.7 \\
        --max-new-tokens 12 --trainable-layers 10 --output-dir outputs/trl_arithmetic

It prints one line per optimizer step (TRL's logged ``reward``) and, with ``--output-dir``, writes ``summary.json``.
``train(TrainConfig(...))`` is importable and returns the per-step rows.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def flag(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Settings of :func:`train`; every field is a ``--flag``."""

    max_steps: int = flag(30, "Optimizer steps (one rollout call per --steps-per-generation steps).")
    seed: int = flag(0, "Seeds the model init (tiny) and TRL's sampling.")
    model: str = flag("tiny", "'tiny' (the embedded model), 'smollm2', 'smollm2-tools' or a model id/path.")
    env: str = flag("guess_number", "A registered env name or an env class path.")
    env_config: str | None = flag(None, "The env's env_config as JSON (guess_number: from --low, --high, --max-turns).")
    tasks: str | None = flag(None, "Task rows to train on (save_to_disk folder, .json/.jsonl/.parquet); no --env then.")
    eval_tasks_path: str | None = flag(None, "Held-out task rows (as --tasks); --eval-tasks N takes the first N.")
    eval_tasks: int = flag(0, "Held-out rows (the env's eval split or --eval-tasks-path) to evaluate on; 0: no.")
    eval_rollouts: int = flag(1, "Episodes per held-out row.")
    control: str = flag("none", "'none' or 'shuffle': each group's rewards are shuffled among its rollouts.")
    trainable_layers: int = flag(0, "Train only the top N decoder layers and the final norm (0: every parameter).")
    num_generations: int = flag(8, "Episodes per task (the GRPO group size).")
    tasks_per_step: int = flag(4, "Task groups per rollout call.")
    steps_per_generation: int = flag(1, "Optimizer steps per rollout call (4 with 8x8 = train_grpo's minibatch 16).")
    lr: float = flag(3e-2, "AdamW learning rate, constant (3e-2 suits the tiny model).")
    low: int = flag(3, "GuessNumberEnv low.")
    high: int = flag(3, "GuessNumberEnv high (== low: a fixed answer to learn).")
    max_turns: int = flag(2, "GuessNumberEnv max_turns.")
    max_new_tokens: int = flag(3, "Token budget of one agent turn.")
    temperature: float = flag(1.0, "Sampling temperature (TRL's, also for log-probs).")
    fp32: bool = flag(False, "On a GPU, train without bf16 autocast (log-probs then agree to ~1e-6).")
    use_vllm: bool = flag(False, "Sample with TRL's vLLM server client.")
    vllm_server_base_url: str | None = flag(None, "vLLM server URL (with --use-vllm).")
    output_dir: str | None = flag(None, "TRL output dir and summary.json (default: a temp dir, no summary).")
    quiet: bool = flag(False, "Do not print the table.")


@dataclass
class StepRow:
    step: int
    reward: float
    reward_std: float
    frac_reward_zero_std: float
    grad_norm: float
    agent_tokens: float
    tool_rate: float = 0.0
    """Share of the step's episodes that called a tool (the rollout function's ``tool_rates``)."""


def train(cfg: TrainConfig, command: str | None = None) -> list[StepRow]:
    """Train and return one :class:`StepRow` per optimizer step (``trainer.state.log_history``); held-out evaluations
    before and after with ``--eval-tasks``, and ``summary.json`` in ``--output-dir``."""
    import torch

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.evaluation import evaluate_agent
    from hf_rollouts.integrations.trl import build_grpo_trainer
    from hf_rollouts.seeding import derive_seed
    from hf_rollouts.training import flush_denormals, task_splits, train_top_layers, write_summary

    started, evaluations = (time.perf_counter(), time.process_time()), {}
    with flush_denormals():
        loaded = load_agent(cfg.model, model_seed=cfg.seed)
        model, tokenizer = loaded.model, loaded.tokenizer
        if cfg.trainable_layers:
            train_top_layers(model, cfg.trainable_layers)
        generations = -(-cfg.max_steps // cfg.steps_per_generation)
        config = json.loads(cfg.env_config) if cfg.env_config else None
        if config is None and cfg.env == "guess_number":
            config = {"low": cfg.low, "high": cfg.high, "max_turns": cfg.max_turns}
        tasks, eval_tasks = task_splits(tokenizer, env=cfg.env, env_config=config, tasks=cfg.tasks,
                                        eval_tasks=cfg.eval_tasks_path, num_train=cfg.tasks_per_step * generations,
                                        num_eval=cfg.eval_tasks)  # fmt: skip
        agent = TransformersAgent(model, tokenizer, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens,
                                  seed=cfg.seed)  # fmt: skip

        def heldout(tag: str) -> None:  # the same rows and seeds as scripts/train_grpo.py's evaluations
            if eval_tasks is not None:
                result = evaluate_agent(
                    eval_tasks, agent, cfg.eval_rollouts, seed=derive_seed("train_grpo_eval", cfg.seed)
                )
                evaluations[tag] = result.as_dict()
                if not cfg.quiet:
                    print(f"held-out ({tag}): {result.describe()}", flush=True)

        heldout("before")
        on_gpu = torch.cuda.is_available()
        trainer, rollout_func = build_grpo_trainer(
            model, tokenizer, tasks, num_generations=cfg.num_generations, tasks_per_step=cfg.tasks_per_step,
            steps_per_generation=cfg.steps_per_generation, max_steps=cfg.max_steps, max_new_tokens=cfg.max_new_tokens,
            control=cfg.control, seed=cfg.seed, output_dir=cfg.output_dir or tempfile.mkdtemp(prefix="train_trl_"),
            learning_rate=cfg.lr, temperature=cfg.temperature, bf16=on_gpu and not cfg.fp32, use_vllm=cfg.use_vllm,
            vllm_server_base_url=cfg.vllm_server_base_url,
        )  # fmt: skip
        trainer.train()
        heldout("after")
    rows = [
        step_row(h, rollout_func.tool_rates, cfg.steps_per_generation)
        for h in trainer.state.log_history
        if "reward" in h
    ]
    if cfg.output_dir:
        steps = [
            {**asdict(r), "step": (r.step - 1) // cfg.steps_per_generation + 1, "optimizer_step": r.step} for r in rows
        ]
        write_summary(cfg.output_dir, command=command, config=asdict(cfg), steps=steps, started=started,
                      heldout_before=evaluations.get("before"), heldout_after=evaluations.get("after"))  # fmt: skip
    return rows


def step_row(h: dict, tool_rates: list[float], per_call: int) -> StepRow:
    call = (int(h["step"]) - 1) // per_call
    return StepRow(int(h["step"]), h["reward"], h.get("reward_std", math.nan), h.get("frac_reward_zero_std") or 0.0,
                   h.get("grad_norm") or 0.0, h.get("completions/mean_length") or 0.0,
                   tool_rates[call] if call < len(tool_rates) else math.nan)  # fmt: skip


def format_table(rows: list[StepRow]) -> str:
    lines = [
        f"{'step':>4} | {'reward':>6} | {'std':>5} | {'zero-std groups':>15} | {'grad_norm':>9} | {'agent tok':>9}"
    ]
    for r in rows:
        bar = "#" * round(20 * max(0.0, min(1.0, r.reward)))
        lines.append(f"{r.step:>4} | {r.reward:>6.3f} | {r.reward_std:>5.2f} | {r.frac_reward_zero_std:>15.2f} | "
                     f"{r.grad_norm:>9.3f} | {r.agent_tokens:>9.2f} {bar}")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The flags of :class:`TrainConfig` (transformers' ``HfArgumentParser``)."""
    from transformers import HfArgumentParser

    (cfg,) = HfArgumentParser(TrainConfig, description=__doc__.split("\n\n")[0]).parse_args_into_dataclasses(argv)
    return cfg


def main(argv: list[str] | None = None) -> int:
    import importlib.util

    import datasets
    import transformers

    if importlib.util.find_spec("trl") is None:
        print("This script needs TRL: pip install 'hf_rollouts[trl]'  (trl>=1.16,<2)")
        return 1
    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    rows = train(cfg, command=shlex.join(["python", "scripts/train_trl.py", *argv]))
    if not cfg.quiet:
        print(format_table(rows))
    k = max(1, len(rows) // 5)
    first, last = sum(r.reward for r in rows[:k]) / k, sum(r.reward for r in rows[-k:]) / k
    print(f"mean reward: {first:.3f} (first {k} steps) -> {last:.3f} (last {k} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
