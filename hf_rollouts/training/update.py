"""One update over a round's rollouts: :func:`grpo_update` (GRPO, under accelerate too), :func:`sft_update` (an
imitation warm start); :func:`flush_denormals` for small random-weight models on x86 CPUs.

A GRPO round (docs/guides/training.md runs it; :func:`hf_rollouts.rounds.collect_rollouts` plays the round)::

    rollouts = collect_rollouts(tasks, agent, 8, seed=round_seed)          # fresh samples, never a cache replay
    prepared = prepare_rollouts(rollouts, flatten=True, drop_constant_groups=True, progress=False)
    metrics = grpo_update(agent.model, optimizer, prepared, pad_token_id=tokenizer.pad_token_id, seed=round_seed)

``agent.model`` *is* the policy: the update changes its weights in place, so the next ``collect_rollouts``
samples from the updated policy (and the agent's fingerprint, which holds a probe of the weights, moves with it).
Modes: ``collect_rollouts`` puts the model in ``eval()`` (no dropout while sampling); :func:`grpo_update` and
:func:`sft_update` put it in ``train()`` for their steps and leave it in ``eval()``, ready to sample again.

Held-out success with an interval is :func:`hf_rollouts.evaluation.evaluate_agent`.

Several processes (``accelerate launch`` / ``torchrun``): pass the ``Accelerator`` and the model and optimizer it
prepared. Every process prepares the same rollouts; each minibatch (the same rows as in one process) is split
across the processes, each takes its share of the rows, and the loss is scaled by the minibatch's token count so
the averaged gradient is the one-process gradient (tested against one process).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset

from .collate import RolloutCollator
from .convention import check_logprob_convention, dataset_logprob_convention
from .data import PreparedRollouts
from .loss import batch_logprobs, grpo_loss, model_device, token_logprobs, truncated_importance_weights

logger = logging.getLogger("hf_rollouts.training")


@dataclass(frozen=True)
class UpdateConfig:
    """How :func:`grpo_update` steps over one round's rollouts."""

    minibatch_size: int = field(default=16, metadata={"help": "Rollouts per optimizer step (over all processes)."})
    epochs: int = field(default=1, metadata={"help": "Passes over the round's rollouts."})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO ratio clip."})
    kl_coef: float = field(default=0.0, metadata={"help": "KL penalty against ref_model (0: none)."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Gradient clipping norm (None: no clip)."})
    share_prefix: bool = field(default=False, metadata={"help": "token_logprobs' share_prefix."})
    warn_kept_groups: float = field(
        default=0.25,
        metadata={"help": "Warn when a round kept fewer than this fraction of its groups (0: never)."},
    )
    importance_sampling_cap: float | None = field(
        default=None,
        metadata={
            "help": "Truncated importance sampling against the sampler/trainer mismatch (None: off). The PPO ratio "
            "is taken against the trainer's own log-probs of the round (one extra forward pass over it, before the "
            "first step) and each token's loss is weighted by min(exp(trainer - sampler), cap), as TRL's "
            "vllm_importance_sampling_correction (token_truncate) does. Off by default: with float32 on both sides "
            "the sampler and the trainer agree to ~1e-6 per token (weights within 1e-5 of 1), so the pass would cost "
            "a forward over the round for nothing; turn it on (TRL's default cap: 3.0) when the sampler runs other "
            "numerics than the trainer (bf16, a GPU engine's kernels, quantized weights), whose gaps reach ~1e-2."
        },
    )

    def __post_init__(self) -> None:
        if self.minibatch_size < 1 or self.epochs < 1:
            raise ValueError(f"minibatch_size and epochs must be >= 1, got {self.minibatch_size}, {self.epochs}.")
        if not 0 <= self.warn_kept_groups <= 1:
            raise ValueError(f"warn_kept_groups must be in [0, 1], got {self.warn_kept_groups}.")
        if self.importance_sampling_cap is not None and not self.importance_sampling_cap > 0:
            raise ValueError(f"importance_sampling_cap must be > 0 or None, got {self.importance_sampling_cap}.")


@dataclass(frozen=True)
class UpdateMetrics:
    """What :func:`grpo_update` did: ``steps`` optimizer steps over ``rollouts`` rows (one per sample: a rollout of
    several samples is several rows); ``loss``, ``clip_fraction``,
    ``approx_kl`` (k3 vs the sampling policy), ``kl`` (vs the reference, 0 without) and ``grad_norm`` (before
    clipping) are means over the steps (each step's over its whole minibatch, every process's share), NaN when there
    was no step. With ``importance_sampling_cap``: ``logprob_gap_max`` / ``logprob_gap_mean`` (``|trainer -
    sampler|`` over the round's loss tokens before the first step: :func:`~.agreement.logprob_gap`'s numbers, for
    free), ``sampling_weight_mean`` and ``sampling_weight_capped`` (the share of loss tokens whose weight hit the
    cap); NaN without."""

    steps: int = 0
    rollouts: int = 0
    loss: float = math.nan
    clip_fraction: float = math.nan
    approx_kl: float = math.nan
    kl: float = math.nan
    grad_norm: float = math.nan
    logprob_gap_max: float = math.nan
    logprob_gap_mean: float = math.nan
    sampling_weight_mean: float = math.nan
    sampling_weight_capped: float = math.nan


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _rows(dataset: Any, indices: list[int]) -> list[dict[str, Any]]:
    getitems = getattr(dataset, "__getitems__", None)  # what a DataLoader calls: one read for the batch
    return getitems(indices) if getitems is not None else [dataset[i] for i in indices]


def _minibatches(n: int, size: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch's minibatches: ``torch.randperm(n, generator)`` cut into ``size`` rows, drawn as a shuffling
    ``DataLoader(generator=...)`` draws them (a base seed first, a second ``randperm`` for its remainder after), so a
    loop written with one gets the same order."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    order = torch.randperm(n, generator=generator).tolist()
    torch.randperm(n, generator=generator)
    return [order[i : i + size] for i in range(0, n, size)]


def _shard(batch: dict[str, torch.Tensor], rank: int, world: int) -> tuple[dict[str, torch.Tensor], bool]:
    """This process's rows of a collated minibatch (every ``world``-th from ``rank``), trimmed to their width; a
    process left without a row gets the first row with a zero weight (``False``), so every process runs backward."""
    rows = list(range(rank, batch["input_ids"].shape[0], world))
    real = bool(rows)
    rows = rows or [0]
    out = {k: v[rows] for k, v in batch.items()}
    width = max(1, int(out["attention_mask"].sum(dim=1).max()))
    return {k: v[:, :width] if v.dim() == 2 else v for k, v in out.items()}, real


def _trainable(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


@torch.no_grad()
def _round_logprobs(
    model: torch.nn.Module,
    dataset: Any,
    collate: RolloutCollator,
    size: int,
    temperature: float | None,
    share_prefix: bool,
) -> list[torch.Tensor]:
    """The trainer's log-probs of every row of the round (``[length]`` each, on the CPU), by minibatches of
    ``size`` in row order, with the model in the mode of the update's steps."""
    device = model_device(model)
    out: list[torch.Tensor] = []
    for start in range(0, len(dataset), size):
        indices = list(range(start, min(start + size, len(dataset))))
        batch = {k: v.to(device) for k, v in collate(_rows(dataset, indices)).items()}
        logprobs = batch_logprobs(model, batch, temperature, share_prefix=share_prefix).float().cpu()
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        out.extend(logprobs[i, : int(n)] for i, n in enumerate(lengths))
    return out


def _padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row[:width]
    return out


def _round_gaps(
    dataset: Any, collate: RolloutCollator, anchors: list[torch.Tensor], cap: float, size: int
) -> dict[str, float]:
    """:class:`UpdateMetrics`' gap and weight fields: the trainer's round log-probs (``anchors``) against the stored
    sampler ones, over every loss token of the round."""
    gaps: list[torch.Tensor] = []
    weights: list[torch.Tensor] = []
    for start in range(0, len(dataset), size):
        indices = list(range(start, min(start + size, len(dataset))))
        batch = collate(_rows(dataset, indices))
        trainer = _padded([anchors[i] for i in indices], batch["input_ids"].shape[1])
        mask = batch["loss_mask"].bool()
        gaps.append((trainer - batch["old_logprobs"])[mask].abs())
        weights.append(truncated_importance_weights(trainer, batch["old_logprobs"], batch["loss_mask"], cap)[mask])
    gap, weight = torch.cat(gaps), torch.cat(weights)
    if not gap.numel():
        return {}
    return {
        "logprob_gap_max": float(gap.max()),
        "logprob_gap_mean": float(gap.mean()),
        "sampling_weight_mean": float(weight.mean()),
        "sampling_weight_capped": float((weight >= cap).float().mean()),
    }


def grpo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rollouts: PreparedRollouts | Dataset,
    *,
    pad_token_id: int,
    config: UpdateConfig | None = None,
    seed: int = 0,
    temperature: float | None = None,
    ref_model: torch.nn.Module | None = None,
    accelerator: Any = None,
) -> UpdateMetrics:
    """One GRPO update over a round's prepared rollouts: ``config.epochs`` passes of shuffled minibatches of
    ``config.minibatch_size`` rows, each a clipped policy-gradient step (:func:`~.loss.grpo_loss`, KL against
    ``ref_model`` when ``config.kl_coef > 0``) with the gradient clipped to ``config.max_grad_norm``.

    ``rollouts``: ``prepare_rollouts(..., flatten=True)`` or its ``.dataset`` (rows with an ``advantage``; an empty
    one takes no step). Given the :class:`PreparedRollouts`, a round that kept fewer than ``config.warn_kept_groups``
    of its groups logs a warning (logger ``hf_rollouts.training``) naming the usual remedies
    (:meth:`~.advantages.RolloutFilterReport.low_signal_warning`); after :func:`~.control.shuffle_advantages`, pass
    ``dataclasses.replace(prepared, dataset=rows)`` to keep it. Log-probs are recomputed at the temperature the rows
    recorded (``temperature`` must agree when given); rows of two settings (flattened runs concatenated) are refused
    before any step, whatever the minibatches. The minibatch order is ``torch.randperm`` with a generator seeded by
    ``seed``. The optimizer steps the parameters in its param groups. With ``accelerator`` (several processes):
    ``model`` and ``optimizer`` are the ones it prepared, and each minibatch is split across processes (module
    docstring). The model is in ``train()`` during the steps and ``eval()`` after. Returns :class:`UpdateMetrics`.
    ``config.importance_sampling_cap``: truncated importance sampling against the sampler/trainer mismatch
    (:class:`UpdateConfig`; every process computes the whole round's trainer log-probs).

    **Normalisation.** A step's loss is the mean over the loss tokens of its whole minibatch (:func:`~.loss.grpo_loss`;
    under accelerate, over every process's share). An episode of several samples is several rows, each with the
    episode's advantage; each sampled token lies in exactly one sample (the env tokens a new sample repeats are never
    loss tokens), so the loss divides by the sampled tokens over all samples, and an episode weighs by its sampled
    tokens, exactly as the same calls played append-only in one row would.
    """
    config = config or UpdateConfig()
    dataset = rollouts.dataset if isinstance(rollouts, PreparedRollouts) else rollouts
    if config.kl_coef > 0 and ref_model is None:
        raise ValueError("grpo_update with kl_coef > 0 needs ref_model (a frozen copy of the starting policy).")
    temperature = _round_temperature(rollouts, dataset, temperature)
    report = rollouts.report if isinstance(rollouts, PreparedRollouts) else None
    warning = report.low_signal_warning(config.warn_kept_groups) if report is not None else None
    if warning and (accelerator is None or accelerator.is_main_process):
        logger.warning("grpo_update: %s", warning)
    collate = RolloutCollator(pad_token_id)
    params = _trainable(optimizer)
    world = accelerator.num_processes if accelerator is not None else 1
    rank = accelerator.process_index if accelerator is not None else 0
    generator = torch.Generator().manual_seed(seed)
    device = model_device(model)
    logs: dict[str, list[float]] = {"loss": [], "clip_fraction": [], "approx_kl_old": [], "kl": [], "grad_norm": []}
    cap = config.importance_sampling_cap
    anchors: list[torch.Tensor] | None = None
    gaps: dict[str, float] = {}
    model.train()
    try:
        if cap is not None and len(dataset):
            size, share = config.minibatch_size, config.share_prefix
            anchors = _round_logprobs(model, dataset, collate, size, temperature, share)
            gaps = _round_gaps(dataset, collate, anchors, cap, size)
        for _ in range(config.epochs if len(dataset) else 0):
            for indices in _minibatches(len(dataset), config.minibatch_size, generator):
                batch = collate(_rows(dataset, indices))
                if anchors is not None:
                    batch["trainer_logprobs"] = _padded([anchors[i] for i in indices], batch["input_ids"].shape[1])
                total_tokens = float(batch["loss_mask"].sum())
                real = True
                if world > 1:
                    batch, real = _shard(batch, rank, world)
                batch = {k: v.to(device) for k, v in batch.items()}
                logprobs = batch_logprobs(model, batch, temperature, share_prefix=config.share_prefix)
                ref = None
                if config.kl_coef > 0:
                    with torch.no_grad():
                        ref = batch_logprobs(ref_model, batch, temperature, share_prefix=config.share_prefix)
                old, weights = batch["old_logprobs"], None
                if anchors is not None:  # the ratio against the trainer's own start; the mismatch in the weight
                    old = batch["trainer_logprobs"]
                    weights = truncated_importance_weights(old, batch["old_logprobs"], batch["loss_mask"], cap)
                loss, metrics = grpo_loss(
                    logprobs,
                    old,
                    batch["advantages"],
                    batch["loss_mask"],
                    clip_eps=config.clip_eps,
                    kl_coef=config.kl_coef,
                    ref_logprobs=ref,
                    sampling_weights=weights,
                )
                if world > 1:  # token mean over the whole minibatch once the processes' gradients are averaged
                    loss = loss * (metrics["num_tokens"] * world / max(total_tokens, 1.0) if real else 0.0)
                (accelerator.backward(loss) if accelerator is not None else loss.backward())
                norm = config.max_grad_norm if config.max_grad_norm is not None else math.inf
                clip = accelerator.clip_grad_norm_ if accelerator is not None else torch.nn.utils.clip_grad_norm_
                logs["grad_norm"].append(float(clip(params, norm)))
                optimizer.step()
                optimizer.zero_grad()
                keys = ("loss", "clip_fraction", "approx_kl_old", "kl")
                if world > 1:  # the minibatch's token means, over every process's share
                    n = metrics["num_tokens"] if real else 0
                    sums = torch.tensor([metrics[k] * n for k in keys] + [n], dtype=torch.float64, device=device)
                    sums = accelerator.reduce(sums, "sum").tolist()
                    metrics = {k: v / max(sums[-1], 1.0) for k, v in zip(keys, sums)}
                for key in keys:
                    logs[key].append(metrics[key])
    finally:
        model.eval()
    return UpdateMetrics(
        steps=len(logs["loss"]),
        rollouts=len(dataset),
        loss=_mean(logs["loss"]),
        clip_fraction=_mean(logs["clip_fraction"]),
        approx_kl=_mean(logs["approx_kl_old"]),
        kl=_mean(logs["kl"]),
        grad_norm=_mean(logs["grad_norm"]),
        **gaps,
    )


def _round_temperature(
    rollouts: PreparedRollouts | Dataset, dataset: Dataset, temperature: float | None
) -> float | None:
    """The temperature of a round's rows, read once from the whole dataset (``ValueError`` for two settings, so a
    run never stops or goes on by where minibatches fall), else from the prepared rollouts' record (a card), else
    ``temperature``; a given ``temperature`` must agree with it."""
    convention = dataset_logprob_convention(dataset) if len(dataset) else None
    if convention is None and isinstance(rollouts, PreparedRollouts):
        convention = rollouts.logprob_convention
    if convention is None or convention.get("temperature") is None:
        return temperature
    if temperature is None:
        return float(convention["temperature"])
    check_logprob_convention(convention, temperature)
    return temperature


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    demonstrations: PreparedRollouts | Dataset,
    *,
    pad_token_id: int,
    steps: int,
    batch_size: int = 32,
    seed: int = 0,
    max_grad_norm: float | None = 1.0,
    share_prefix: bool = True,
) -> list[float]:
    """A warm start by imitation: ``steps`` optimizer steps of token-mean cross-entropy on the *agent tokens* of
    flattened demonstration rollouts (``prepare_rollouts(..., flatten=True)``, any agent, with or without log-probs;
    prompts, env and tool tokens are never in the loss). Batches of ``batch_size`` rows in ``torch.randperm`` order
    (a generator seeded by ``seed``; a new order each pass), as many passes as ``steps`` needs. Pass the same
    ``optimizer`` to continue. The model is in ``train()`` during the steps and ``eval()`` after. Returns the
    losses."""
    dataset = demonstrations.dataset if isinstance(demonstrations, PreparedRollouts) else demonstrations
    if steps > 0 and not len(dataset):
        raise ValueError("sft_update got no demonstration rows; prepare them with prepare_rollouts(flatten=True).")
    collate = RolloutCollator(pad_token_id)
    params = _trainable(optimizer)
    generator = torch.Generator().manual_seed(seed)
    device = model_device(model)
    losses: list[float] = []
    model.train()
    try:
        while len(losses) < steps:
            for indices in _minibatches(len(dataset), batch_size, generator):
                batch = collate(_rows(dataset, indices))
                mask = batch["agent_mask"].to(device)
                logprobs = token_logprobs(  # the likelihood at temperature 1, whatever sampled the demonstrations
                    model, batch["input_ids"], batch["attention_mask"], 1.0, loss_mask=mask, share_prefix=share_prefix
                )
                loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm is not None else math.inf)
                optimizer.step()
                optimizer.zero_grad()
                losses.append(float(loss.detach()))
                if len(losses) == steps:
                    break
    finally:
        model.eval()
    return losses


@contextlib.contextmanager
def flush_denormals(enabled: bool = True) -> Iterator[None]:
    """Flush float32 denormals to zero in the block (``torch.set_flush_denormal``, a process-wide switch turned off
    again after): small random-weight models hit denormals and run 10-20x slower on x86 CPUs without it."""
    flushing = enabled and torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if flushing:
            torch.set_flush_denormal(False)
