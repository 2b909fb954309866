"""Per-token log-probabilities under a model, and the clipped GRPO/PPO policy loss."""

from __future__ import annotations

import inspect

import torch

from .convention import row_temperatures


def batch_logprobs(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float | None = None,
    *,
    share_prefix: bool = False,
) -> torch.Tensor:
    """:func:`token_logprobs` of a :class:`~.collate.RolloutCollator` batch: its ``input_ids``, ``attention_mask``
    and ``loss_mask`` (the head runs from the first loss token on), each row at the temperature it recorded
    (``logprob_temperature``) unless ``temperature`` is given, which must then agree with them."""
    return token_logprobs(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        temperature,
        recorded_temperature=batch.get("logprob_temperature"),
        loss_mask=batch.get("loss_mask"),
        share_prefix=share_prefix,
    )


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    temperature: float | None = None,
    *,
    convention: dict | None = None,
    recorded_temperature: torch.Tensor | None = None,
    loss_mask: torch.Tensor | None = None,
    share_prefix: bool = False,
) -> torch.Tensor:
    """Per-position log-probabilities of the tokens in ``input_ids`` under ``model``.

    Returns a float32 ``[batch, seq]`` tensor on the model's device (``input_ids`` and ``attention_mask`` are
    moved there, so a CPU batch works with a model on CUDA) where position ``t`` holds
    ``log_softmax(logits[t - 1] / temperature)[input_ids[t]]`` — the convention of
    the stored ``padded_logprobs``. Position 0 and padding positions
    (``attention_mask == 0``) hold 0. ``temperature == 0`` (greedy sampling)
    means unscaled logits, as in the agent. Differentiable; call it under
    ``torch.no_grad()`` for reference log-probs.

    ``temperature``: ``None`` (default) recomputes each row at the temperature its stored log-probs were made at,
    read from ``recorded_temperature`` (the collator's ``logprob_temperature`` ``[batch]`` tensor) or ``convention``
    (``PreparedRollouts.logprob_convention``): a batch mixing two settings is computed row by row, the same whatever
    batch a row falls in. Rows neither records are computed at 1.0 with a ``UserWarning`` saying so. A
    ``temperature`` that does not match a record raises ``ValueError`` saying how to fix it
    (:func:`~.convention.check_logprob_convention`; :func:`~.convention.row_temperatures`).

    ``loss_mask`` (same shape as ``input_ids``): only the positions from the batch's first loss token on are scored,
    and the language-model head runs on those positions only (the model's ``logits_to_keep`` argument, which
    transformers' causal LMs take); positions before hold 0. With a long prompt and a short answer this skips most
    of the head's ``[tokens, vocabulary]`` product and its backward (49,152 columns for SmolLM2). The values at the
    scored positions are the same as without it.

    ``share_prefix=True`` (with ``loss_mask``): the tokens every row begins with (a system prompt, a tool list, a
    GRPO group's question), up to the first loss token, run through the model once, and their key/value cache is
    repeated over the batch for the rest of each row; gradients flow back through it to that one pass. The values
    and gradients are those of the full pass up to float rounding (tested); the work on the shared part is one row's
    instead of the batch's. Needs a model that takes ``past_key_values`` (transformers' causal LMs).
    """
    temperatures = row_temperatures(temperature, input_ids.shape[0], convention, recorded_temperature)
    device = model_device(model)
    input_ids = input_ids.to(device)
    attention_mask = None if attention_mask is None else attention_mask.to(device)
    width = input_ids.shape[1]
    start = 1  # the first position whose log-prob is computed (position 0 has no context)
    if loss_mask is not None:
        if loss_mask.shape != input_ids.shape:
            raise ValueError(f"loss_mask has shape {tuple(loss_mask.shape)}, input_ids {tuple(input_ids.shape)}.")
        columns = loss_mask.bool().any(dim=0).nonzero()
        start = max(1, int(columns[0])) if len(columns) else width
    if start >= width:  # nothing to score
        return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    kwargs = {} if loss_mask is None else {"logits_to_keep": width - start + 1}
    shared = common_prefix_length(input_ids, attention_mask) if share_prefix and loss_mask is not None else 0
    shared = min(shared, start - 1)  # every scored position's logits come from the pass over the rest
    if shared > 0 and input_ids.shape[0] > 1:
        prefix = model(
            input_ids=input_ids[:1, :shared],
            attention_mask=None if attention_mask is None else attention_mask[:1, :shared],
            use_cache=True,
            logits_to_keep=1,
        )
        keyword = _cache_keyword(model)
        cache = getattr(prefix, keyword)
        cache.batch_repeat_interleave(input_ids.shape[0])
        output = model(
            input_ids=input_ids[:, shared:], attention_mask=attention_mask, use_cache=True, **{keyword: cache}, **kwargs
        )
    else:
        output = model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    logits = output.logits[:, -(width - start + 1) : -1].float()
    if any(t > 0 and t != 1 for t in temperatures):  # 0 is greedy: unscaled logits, as in the agent
        scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=logits.dtype, device=logits.device)
        logits = logits / scale.view(-1, 1, 1)
    targets = input_ids[:, start:].unsqueeze(-1)
    picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.cat([torch.zeros_like(picked[:, :1]).expand(-1, start), picked], dim=1)
    if attention_mask is not None:
        out = torch.where(attention_mask.bool(), out, torch.zeros_like(out))
    return out


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` computes: its ``device`` (transformers models), else its first parameter's device."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def _cache_keyword(model: torch.nn.Module) -> str:
    """``cache`` where transformers renamed ``past_key_values`` (5.2x, which warns on the old name), else the old
    name; the same word names the cache in the model's output."""
    forward = type(getattr(model, "module", model)).forward  # through a DistributedDataParallel wrapper
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> int:
    """How many leading positions hold the same token, attended, in every row."""
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= attention_mask.bool().all(dim=0)
    differ = (~same).nonzero()
    return int(differ[0]) if len(differ) else input_ids.shape[1]


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    sampling_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-style clipped policy loss, averaged over the loss tokens of the batch.

    Per loss token: ``-min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A)``
    with ``ratio = exp(logprobs - old_logprobs)``, plus ``kl_coef * k3`` where
    ``k3 = exp(ref - logprobs) - (ref - logprobs) - 1`` (an unbiased, non-negative
    estimate of ``KL(policy || ref)``) when ``kl_coef > 0``. The loss is the sum
    over tokens with ``loss_mask`` divided by their number (token-level mean,
    0 for a batch with no loss token).

    ``sampling_weights`` (same shape, detached): a per-token weight on the policy term, the truncated importance
    weight ``min(pi_trainer / pi_sampler, cap)`` of :func:`truncated_importance_weights` when the rollouts were
    sampled by other numerics than the trainer's (a vLLM engine, bf16); ``old_logprobs`` are then the trainer's own
    log-probs of the sampled tokens before the update, as in TRL's ``vllm_importance_sampling_correction``. All-ones
    weights give exactly the loss without them.

    Tokens outside ``loss_mask`` get exactly zero gradient, and NaN/inf in any input
    there cannot leak into the loss or the gradient.

    Returns ``(loss, metrics)``; metrics are floats: ``loss``, ``policy_loss``,
    ``kl`` (mean k3 vs ``ref_logprobs``, 0 without), ``approx_kl_old`` (mean k3 vs
    the sampling policy), ``clip_fraction``, ``ratio_mean``, ``advantage_mean``,
    ``num_tokens``; with ``sampling_weights``, also ``sampling_weight_mean``.
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError(
            "kl_coef > 0 needs ref_logprobs (token_logprobs of the reference model, under torch.no_grad())."
        )
    shapes = {t.shape for t in (logprobs, old_logprobs, advantages, loss_mask)}
    if len(shapes) != 1:
        raise ValueError(
            f"logprobs, old_logprobs, advantages and loss_mask must share one shape, got {sorted(map(tuple, shapes))}."
        )
    mask = loss_mask.bool()
    zero = torch.zeros_like(logprobs)
    old = old_logprobs.to(logprobs.dtype).detach()
    adv = torch.where(mask, advantages.to(logprobs.dtype), zero).detach()
    log_ratio = torch.where(mask, logprobs - old, zero)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if sampling_weights is not None:
        if sampling_weights.shape != logprobs.shape:
            raise ValueError(
                f"sampling_weights has shape {tuple(sampling_weights.shape)}, logprobs {tuple(logprobs.shape)}."
            )
        weights = torch.where(mask, sampling_weights.to(logprobs.dtype).detach(), zero)
        per_token = per_token * weights
    kl = zero
    if ref_logprobs is not None:
        delta = torch.where(mask, ref_logprobs.to(logprobs.dtype).detach() - logprobs, zero)
        kl = torch.exp(delta) - delta - 1.0
    total = per_token + kl_coef * kl if kl_coef > 0 else per_token
    n = mask.sum()
    denom = n.clamp(min=1).to(logprobs.dtype)
    loss = torch.where(mask, total, zero).sum() / denom
    with torch.no_grad():
        k3_old = (ratio - 1.0) - log_ratio  # k3 estimate of KL(old || new) on samples of old
        metrics = {
            "loss": float(loss),
            "policy_loss": float(torch.where(mask, per_token, zero).sum() / denom),
            "kl": float(torch.where(mask, kl, zero).sum() / denom),
            "approx_kl_old": float(torch.where(mask, k3_old, zero).sum() / denom),
            "clip_fraction": float(((ratio - 1.0).abs() > clip_eps).logical_and(mask).sum() / denom),
            "ratio_mean": float(torch.where(mask, ratio, zero).sum() / denom),
            "advantage_mean": float(adv.sum() / denom),
            "num_tokens": int(n),
        }
        if sampling_weights is not None:
            metrics["sampling_weight_mean"] = float(weights.sum() / denom)
    return loss, metrics


def truncated_importance_weights(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, loss_mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token truncated importance weights ``min(exp(trainer - sampler), cap)`` on ``loss_mask``, 1 elsewhere
    (TRL's ``vllm_importance_sampling_mode="token_truncate"`` with ``vllm_importance_sampling_clip_max=cap``; the TIS
    correction of sampler/trainer mismatch). The sampler drew the tokens; the weight turns the gradient into one under
    the trainer's distribution, and the cap bounds its variance where the sampler gave a token much less mass than
    the trainer does. Detached. A NaN or missing sampler log-prob (off the mask) weighs 1."""
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}.")
    mask = loss_mask.bool()
    log_ratio = torch.where(mask, trainer_logprobs.detach().float() - sampler_logprobs.float(), 0.0)
    return torch.exp(log_ratio).clamp(max=cap).where(mask, torch.ones_like(log_ratio))
