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

import os
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from hf_rollouts.recipes import runs

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
HELPS = {
    "lr": "AdamW learning rate, constant (3e-2 suits the tiny model).",
    "temperature": "Sampling temperature (TRL's, also for log-probs).",
    "output_dir": "TRL output dir and summary.json (default: a temp dir, no summary).",
}
Run = runs.with_defaults(runs.RunOptions, HELPS, lr=3e-2, max_turns=2, temperature=1.0, output_dir=None)


@dataclass
class TrainConfig(Run, runs.TaskFileOptions):
    """Settings of :func:`train`; every field is a ``--flag``."""

    max_steps: int = runs.flag(30, "Optimizer steps (one rollout call per --steps-per-generation steps).")
    num_generations: int = runs.flag(8, "Episodes per task (the GRPO group size).")
    tasks_per_step: int = runs.flag(4, "Task groups per rollout call.")
    steps_per_generation: int = runs.flag(
        1, "Optimizer steps per rollout call (4 with 8x8 = train_grpo's minibatch 16)."
    )
    fp32: bool = runs.flag(False, "On a GPU, train without bf16 autocast (log-probs then agree to ~1e-6).")
    use_vllm: bool = runs.flag(False, "Sample with TRL's vLLM server client.")
    vllm_server_base_url: str | None = runs.flag(None, "vLLM server URL (with --use-vllm).")


def train(cfg: TrainConfig, command: str | None = None) -> list[runs.StepRow]:
    """Train and return one :class:`~hf_rollouts.recipes.runs.StepRow` per optimizer step; held-out evaluations
    before and after with ``--eval-tasks``, and ``summary.json`` in ``--output-dir``."""
    import torch

    from hf_rollouts.integrations.trl import build_grpo_trainer
    from hf_rollouts.recipes import task_splits, write_summary
    from hf_rollouts.training import flush_denormals

    started = (time.perf_counter(), time.process_time())
    with flush_denormals():
        model, tokenizer, agent, _ = runs.load_policy(cfg)
        generations = -(-cfg.max_steps // cfg.steps_per_generation)
        tasks, eval_tasks = task_splits(tokenizer, env=cfg.env, env_config=runs.env_config_of(cfg), tasks=cfg.tasks,
                                        eval_tasks=cfg.eval_tasks_path, num_train=cfg.tasks_per_step * generations,
                                        num_eval=cfg.eval_tasks)  # fmt: skip
        before = runs.heldout(eval_tasks, agent, cfg, "before")
        trainer, rollout_func = build_grpo_trainer(
            model, tokenizer, tasks, num_generations=cfg.num_generations, tasks_per_step=cfg.tasks_per_step,
            steps_per_generation=cfg.steps_per_generation, max_steps=cfg.max_steps, max_new_tokens=cfg.max_new_tokens,
            control=cfg.control, seed=cfg.seed, output_dir=cfg.output_dir or tempfile.mkdtemp(prefix="train_trl_"),
            learning_rate=cfg.lr, temperature=cfg.temperature, bf16=torch.cuda.is_available() and not cfg.fp32,
            use_vllm=cfg.use_vllm, vllm_server_base_url=cfg.vllm_server_base_url,
        )  # fmt: skip
        trainer.train()
        after = runs.heldout(eval_tasks, agent, cfg, "after")
    rows = runs.step_rows(trainer.state.log_history, rollout_func.tool_rates, cfg.steps_per_generation)
    if cfg.output_dir:
        steps = [{**asdict(r), "step": (r.step - 1) // cfg.steps_per_generation + 1, "optimizer_step": r.step}
                 for r in rows]  # fmt: skip
        write_summary(cfg.output_dir, command=command, config=asdict(cfg), steps=steps, started=started,
                      heldout_before=before, heldout_after=after)  # fmt: skip
    return rows


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """The flags of :class:`TrainConfig`."""
    return runs.parse_options(TrainConfig, argv, __doc__.split("\n\n")[0])


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
        print(runs.format_steps(rows))
    k = max(1, len(rows) // 5)
    first, last = sum(r.reward for r in rows[:k]) / k, sum(r.reward for r in rows[-k:]) / k
    print(f"mean reward: {first:.3f} (first {k} steps) -> {last:.3f} (last {k} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
