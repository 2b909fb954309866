"""A round of fresh rollouts for a training loop or an evaluation: :func:`collect_rollouts`, the pipeline's run that
never replays a cache (the agent's weights may have changed under the same fingerprint).

Training's update (:func:`hf_rollouts.training.grpo_update`) and held-out success
(:func:`hf_rollouts.evaluation.evaluate_agent`) both take the rollouts it returns; it sits here, beside the pipeline,
so that neither imports the other.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset

from .distributed import process_state
from .pipeline import generate_rollouts
from .schema import ROLLOUT_FEATURES


def collect_rollouts(
    tasks: Dataset,
    agent: Any,
    num_rollouts: int,
    *,
    seed: int,
    cache_dir: str | Path | None = None,
    policy_version: int | None = None,
    **options: Any,
) -> Dataset:
    """One round of rollouts of the agent as it is now: :func:`~hf_rollouts.pipeline.generate_rollouts` that never
    reads a cache (``load_from_cache_file=False``: a training loop must never replay an earlier round), with no
    progress bar, and the agent's ``model`` (if any) in ``eval()`` mode.

    ``cache_dir``: where the shard files go; by default a temporary directory removed when the returned dataset is
    garbage collected. Give each round its own ``seed`` (``derive_seed("my_run", seed, round)``). ``options`` go to
    ``generate_rollouts``.

    ``policy_version``: the version of the policy that samples this round (the loop's update count), written to every
    rollout's ``policy_versions`` entry (null without it); :func:`hf_rollouts.training.staleness_filter` reads it.
    """
    model = getattr(agent, "model", None)
    if isinstance(model, torch.nn.Module):
        model.eval()
    scratch = None
    if cache_dir is None:
        scratch = cache_dir = _shared_scratch()
    options.setdefault("progress", False)
    rollouts = generate_rollouts(
        tasks, agent, num_rollouts, seed=seed, cache_dir=cache_dir, load_from_cache_file=False, **options
    )
    if policy_version is not None:
        column = [[int(policy_version)] * len(r) for r in rollouts["final_rewards"]]
        feature = ROLLOUT_FEATURES["policy_versions"]
        rollouts = rollouts.remove_columns("policy_versions").add_column("policy_versions", column, feature=feature)
    if scratch is not None and process_state().is_main_process:
        weakref.finalize(rollouts, shutil.rmtree, scratch, True)
    return rollouts


def _shared_scratch() -> str | None:
    """A new temporary directory, the main process's in every process of a distributed run (the processes executor
    reads the other processes' shard files there)."""
    state = process_state()
    path = tempfile.mkdtemp(prefix="hf_rollouts_round_") if state.is_main_process else None
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        path = broadcast_object_list([path])[0]
    return path


__all__ = ["collect_rollouts"]
