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

**A real model** (docs/guides/training.md), as in ``scripts/train_grpo.py``: ``--model smollm2`` (or
``smollm2-tools``), ``--env`` with ``--env-config`` JSON, ``--eval-tasks N`` held-out rows evaluated through the
pipeline before and after training (95% Wilson interval), ``--control shuffle`` (each group's rewards shuffled among
its rollouts before TRL computes advantages) and ``--trainable-layers K``::

    python scripts/train_trl.py --model smollm2 --env arithmetic --eval-tasks 160 --max-steps 20 \\
        --tasks-per-step 8 --num-generations 8 --lr 2e-5 --temperature 0.7 --max-new-tokens 12 --trainable-layers 10 \\
        --output-dir outputs/trl_arithmetic

With ``--output-dir`` it writes ``summary.json`` (the command, the held-out evaluations, TRL's per-step rows, wall and
CPU time). ``train(TrainConfig(...))`` is importable and returns the per-step rows.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@dataclass
class TrainConfig:
    """Settings of :func:`train`; every field is a ``--flag``."""

    max_steps: int = field(
        default=30, metadata={"help": "Optimizer steps (one rollout call per --steps-per-generation steps)."}
    )
    seed: int = field(default=0, metadata={"help": "Seeds the model init (tiny) and TRL's sampling."})
    model: str = field(
        default="tiny",
        metadata={"help": "'tiny' (the embedded model), 'smollm2', 'smollm2-tools' or a model id/path."},
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
    control: str = field(
        default="none",
        metadata={"help": "'none' or 'shuffle': each group's rewards are shuffled among its rollouts (control run)."},
    )
    trainable_layers: int = field(
        default=0, metadata={"help": "Train only the top N decoder layers and the final norm (0: every parameter)."}
    )
    num_generations: int = field(default=8, metadata={"help": "Episodes per task (the GRPO group size)."})
    tasks_per_step: int = field(
        default=4, metadata={"help": "Task groups per rollout call (per optimizer step when --steps-per-generation 1)."}
    )
    steps_per_generation: int = field(
        default=1,
        metadata={
            "help": "Optimizer steps per rollout call: its episodes are split into this many minibatches (TRL's "
            "steps_per_generation; 4 with 8x8 episodes is what scripts/train_grpo.py does with --minibatch-size 16)."
        },
    )
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
    output_dir: str | None = field(
        default=None, metadata={"help": "TRL output dir and summary.json (default: a temp dir, no summary)."}
    )
    quiet: bool = field(default=False, metadata={"help": "Do not print the table."})


def load_model(cfg: TrainConfig):
    """``(model, tokenizer)`` of ``--model`` (:func:`hf_rollouts.agents.loading.load_agent` specs), with only the top
    ``--trainable-layers`` trainable when set."""
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.training import train_top_layers

    agent = load_agent(cfg.model, model_seed=cfg.seed)
    model, tokenizer = agent.model, agent.tokenizer
    if cfg.trainable_layers:
        train_top_layers(model, cfg.trainable_layers)
    return model, tokenizer


def build(cfg: TrainConfig, model=None, tokenizer=None):
    """``(trainer, rollout_func)`` for ``cfg``: the GRPOTrainer wired to hf_rollouts (``model`` and ``tokenizer``
    default to :func:`load_model`'s)."""
    import torch
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from hf_rollouts.integrations.trl import env_reward, make_rollout_func, shuffled_env_reward, to_trl_dataset

    if cfg.control not in ("none", "shuffle"):
        raise ValueError(f"--control must be 'none' or 'shuffle', got {cfg.control!r}.")
    if model is None:
        model, tokenizer = load_model(cfg)
    on_cpu = not torch.cuda.is_available()
    generations = -(-cfg.max_steps // cfg.steps_per_generation)
    if cfg.tasks:
        tasks = load_task_rows(cfg.tasks)
    else:
        tasks = make_env(cfg, tokenizer).get_train_dataset(cfg.tasks_per_step * generations)
    episodes = cfg.tasks_per_step * cfg.num_generations
    if episodes % cfg.steps_per_generation:
        raise ValueError(
            f"--tasks-per-step x --num-generations ({episodes}) must split into --steps-per-generation "
            f"({cfg.steps_per_generation}) equal minibatches."
        )
    args = GRPOConfig(
        output_dir=cfg.output_dir or tempfile.mkdtemp(prefix="train_trl_"),
        max_steps=cfg.max_steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        num_generations=cfg.num_generations,
        per_device_train_batch_size=episodes // cfg.steps_per_generation,
        steps_per_generation=cfg.steps_per_generation,
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
    reward = shuffled_env_reward(cfg.num_generations, cfg.seed) if cfg.control == "shuffle" else env_reward
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=args,
        train_dataset=to_trl_dataset(tasks),
        reward_funcs=[reward],
        rollout_func=rollout_func,
    )
    trainer.remove_callback(PrinterCallback)  # this script prints its own table
    return trainer, rollout_func


def load_task_rows(path: str):
    """Task rows from ``--tasks`` / ``--eval-tasks-path``: a .json/.jsonl file, or what
    :func:`hf_rollouts.sources.load_dataset_source` reads (a save_to_disk folder, parquet)."""
    from datasets import load_dataset

    from hf_rollouts.sources import load_dataset_source

    if path.endswith((".json", ".jsonl")):
        return load_dataset("json", data_files=path, split="train")
    return load_dataset_source(path)


def heldout_tasks(cfg: TrainConfig, tokenizer):
    """The held-out rows: the first ``--eval-tasks`` of ``--eval-tasks-path`` (all of them without ``--eval-tasks``),
    else the env's eval split; ``None`` when neither is asked for."""
    if cfg.eval_tasks_path:
        rows = load_task_rows(cfg.eval_tasks_path)
        return rows.select(range(min(cfg.eval_tasks, len(rows)))) if cfg.eval_tasks else rows
    return make_env(cfg, tokenizer).get_eval_dataset(cfg.eval_tasks) if cfg.eval_tasks else None


def make_env(cfg: TrainConfig, tokenizer):
    from hf_rollouts.envs import get_env_class

    if cfg.env_config:
        config = json.loads(cfg.env_config)
    elif cfg.env == "guess_number":
        config = {"low": cfg.low, "high": cfg.high, "max_turns": cfg.max_turns}
    else:
        config = {}
    return get_env_class(cfg.env)(tokenizer, config)


@dataclass
class StepRow:
    step: int
    reward: float
    reward_std: float
    frac_reward_zero_std: float
    grad_norm: float
    agent_tokens: float

    tool_rate: float = 0.0
    """Share of the step's episodes that called a tool (from the rollout function's episodes)."""


def train(cfg: TrainConfig, command: str | None = None) -> list[StepRow]:
    """Train and return one :class:`StepRow` per optimizer step (from ``trainer.state.log_history``); with
    ``--eval-tasks`` the held-out evaluations run before and after, and ``summary.json`` goes to ``--output-dir``
    (``command`` is recorded there)."""
    import torch

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.evaluation import evaluate_agent
    from hf_rollouts.seeding import derive_seed

    started, cpu_started = time.perf_counter(), time.process_time()
    flushing = torch.set_flush_denormal(True)  # the tiny model hits float32 denormals: 10-20x slower on x86
    evaluations = {}
    try:
        model, tokenizer = load_model(cfg)
        eval_tasks = heldout_tasks(cfg, tokenizer)
        scratch = Path(cfg.output_dir or tempfile.mkdtemp(prefix="train_trl_")) / "eval_cache"

        def heldout(tag: str) -> None:
            if eval_tasks is None:
                return
            agent = TransformersAgent(
                model, tokenizer, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
            )
            # the same rows and sampling seeds before and after, and as scripts/train_grpo.py's evaluations: both
            # scripts' evaluations of one model are the same episodes
            seed = derive_seed("train_grpo_eval", cfg.seed)
            result = evaluate_agent(eval_tasks, agent, cfg.eval_rollouts, seed=seed, cache_dir=scratch / tag)
            evaluations[tag] = result.as_dict()
            if not cfg.quiet:
                print(f"held-out ({tag}): {result.describe()}", flush=True)

        heldout("before")
        trainer, rollout_func = build(cfg, model, tokenizer)
        tool_rates: list[float] = []
        play = rollout_func.__call__

        def rollout(prompts, trainer):  # the bridge's rollout function, noting each batch's tool-call rate
            out = play(prompts, trainer)
            episodes = [e for e in rollout_func.last_episodes if e["status"] != "error"]
            tool_rates.append(sum(1 for e in episodes if e.get("num_tool_calls", 0)) / max(1, len(episodes)))
            return out

        trainer.rollout_func = rollout
        trainer.train()
        model.eval()
        heldout("after")
    finally:
        if flushing:
            torch.set_flush_denormal(False)
    rows = []
    for h in trainer.state.log_history:
        if "reward" in h:
            step = int(h["step"])
            rows.append(
                StepRow(
                    step=step,
                    reward=h["reward"],
                    reward_std=h.get("reward_std", math.nan),
                    frac_reward_zero_std=h.get("frac_reward_zero_std") or 0.0,
                    grad_norm=h.get("grad_norm") or 0.0,
                    agent_tokens=h.get("completions/mean_length") or 0.0,
                    tool_rate=tool_rates[call]
                    if (call := (step - 1) // cfg.steps_per_generation) < len(tool_rates)
                    else math.nan,
                )
            )
    if cfg.output_dir:
        summary = {
            "command": command,
            "config": asdict(cfg),
            "heldout_before": evaluations.get("before"),
            "heldout_after": evaluations.get("after"),
            # one row per rollout call (a generate-then-update round, as train_grpo.py's iterations)
            "steps": [
                {**asdict(r), "step": (r.step - 1) // cfg.steps_per_generation + 1, "optimizer_step": r.step}
                for r in rows
            ],
            "wall_seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu_started,
            "torch_threads": torch.get_num_threads(),
        }
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.output_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
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
    import shlex

    argv = sys.argv[1:] if argv is None else argv
    rows = train(cfg, command=shlex.join(["python", "scripts/train_trl.py", *argv]))
    if not cfg.quiet:
        print(format_table(rows))
    k = max(1, len(rows) // 5)
    first = sum(r.reward for r in rows[:k]) / k
    last = sum(r.reward for r in rows[-k:]) / k
    print(f"mean reward: {first:.3f} (first {k} steps) -> {last:.3f} (last {k} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
