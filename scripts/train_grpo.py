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
(a base rate). ``train(TrainConfig(...))`` is importable and returns the per-iteration stats. The loop is the
library's (:mod:`hf_rollouts.recipes.train`); ``hf-rollouts train CONFIG`` runs it from a YAML or TOML file of these
options. ``--checkpoint-every N`` / ``--resume``, ``--report-to trackio`` and ``--lora-rank R`` are there too
(docs/guides/training.md).

**vLLM samples** (``--backend vllm``, in the vLLM venv: ``bash scripts/setup_vllm.sh``): the policy's starting
weights are saved to a temporary directory, an in-process :class:`~hf_rollouts.agents.vllm.VLLMAgent` (float32,
``processed`` log-probs, the trainer's convention) plays every round and the held-out evaluations, and after each
update ``agent.sync_weights(model)`` loads the trained weights into it. ``--kv-cache-gib`` sizes its KV cache (the
rest of the memory is the trainer's); ``--logprob-gap`` measures each round's sampler/trainer gap;
``--importance-sampling-cap C`` turns on truncated importance sampling in the update. Each row of ``metrics.json``
times its phases (``collect``, ``update``: prepare + ``grpo_update``, ``sync``, ``gap``). One process only.
"""

from __future__ import annotations

import shlex
import sys

from accelerate import PartialState

from hf_rollouts.recipes import runs
from hf_rollouts.recipes.train import train, vllm_agent
from hf_rollouts.recipes.train_config import BACKENDS, TrainConfig

__all__ = ["BACKENDS", "TrainConfig", "main", "parse_args", "train", "vllm_agent"]


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
