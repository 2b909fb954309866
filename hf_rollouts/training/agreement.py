"""How far the trainer's recomputed log-probabilities are from the stored sampling ones.

A PPO/GRPO ratio is ``exp(new - old)``: at the first update on fresh rollouts it should be exactly 1, and it is
only as exact as the sampler and the trainer agree on ``log_softmax(logits / T)`` of each sampled id. They run
different code (a decode step on a KV cache against one full forward; maybe other dtypes, autocast, kernels), so
they agree only up to rounding. :func:`logprob_gap` measures it, per agent token, over a prepared rollout dataset.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from datasets import Dataset

from .collate import RolloutCollator
from .convention import dataset_logprob_convention
from .loss import model_device, token_logprobs


@dataclass(frozen=True)
class LogprobGap:
    """``|stored - recomputed|`` over the ``tokens`` agent tokens that have a stored log-prob (the loss tokens)."""

    tokens: int
    max_abs: float
    mean_abs: float


@torch.no_grad()
def logprob_gap(
    model: torch.nn.Module,
    rows: Dataset,
    pad_token_id: int,
    temperature: float | None = None,
    *,
    convention: dict | None = None,
    autocast_dtype: torch.dtype | None = None,
    batch_size: int = 16,
) -> LogprobGap:
    """Recompute the log-probs of flattened rollout ``rows`` (``prepare_rollouts(..., flatten=True).dataset``) with
    ``model`` as a trainer would (:func:`~.loss.token_logprobs`, under ``torch.autocast(autocast_dtype)`` when
    given, as ``TrainingArguments(bf16=True)`` runs the forward) and compare them with the stored ones on every
    agent token the loss would use. ``temperature``: by default the one the rows recorded (it must agree when
    given; rows of two settings are refused up front, as :func:`~.data.prepare_rollouts` refuses them)."""
    dataset_logprob_convention(rows)
    collate = RolloutCollator(pad_token_id, advantage="per_token")
    device = model_device(model)
    total, worst, count = 0.0, 0.0, 0
    for start in range(0, len(rows), batch_size):
        batch = collate([rows[i] for i in range(start, min(start + batch_size, len(rows)))])
        cast = (
            torch.autocast(device.type, dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with cast:
            new = token_logprobs(
                model,
                batch["input_ids"],
                batch["attention_mask"],
                temperature,
                convention=convention,
                recorded_temperature=batch["logprob_temperature"],
            )
        mask = batch["loss_mask"].bool()
        gap = (new.float().cpu() - batch["old_logprobs"])[mask].abs()
        if gap.numel():
            total, worst, count = total + float(gap.sum()), max(worst, float(gap.max())), count + gap.numel()
    return LogprobGap(count, worst, total / count if count else float("nan"))
