"""The two generation backends of :class:`~.agent.TransformersAgent`, each one function.

* :func:`generate_padded` — left-padded batched ``model.generate`` with an explicit
  attention mask, optionally continuing from a kept KV cache (:mod:`.kv_cache`);
* :func:`generate_continuous` — transformers' continuous batching (``generate_batch``).

Both return, per prompt, the sampled ids and ``log_softmax(logits / T)`` of each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from ...types import AgentRequest
from .kv_cache import GrowingCache, KVState, cache_kwarg, extend, kv_reuse_unsafe_reason, left_pad
from .sampler import RowSampler

Sampled = list[tuple[list[int], list[float]]]


@torch.inference_mode()
def generate_padded(
    model: PreTrainedModel,
    requests: list[AgentRequest],
    config: GenerationConfig,
    *,
    temperature: float,
    pad_id: int,
    kv: KVState | None,
    rows: list[int] | None,
    keep_kv: bool,
    stop_len: Callable[[list[int]], int],
    sampler: RowSampler | None = None,
    stopping: Callable[[int], list] | None = None,
) -> tuple[Sampled, KVState | None]:
    """One batched ``generate`` for ``requests``; returns the samples and the cache to keep.

    With ``rows`` (from :func:`~.kv_cache.reusable_rows`) the call continues from ``kv`` and
    prefills only each episode's new ids. With ``keep_kv`` the new cache is returned for the
    next turn; ``stop_len`` gives how many sampled ids of a row are real (up to its stop).
    With ``sampler`` (:class:`~.sampler.RowSampler`, for a greedy ``config``) each row samples from the
    random stream of its own seed, and the sampler reports the log-probabilities (``config`` need not ask for
    ``output_logits``); without it ``config`` samples with torch's global generator and must set
    ``output_logits=True``. A fresh prefill of a full-attention model gets a
    :class:`~.kv_cache.GrowingCache` (in-place decode steps); other models get ``generate``'s own cache.
    ``stopping(width)`` gives extra stopping criteria for the call (stop strings), ``width`` being where
    generated ids start.
    """
    device = model.device
    prompts = [r.prompt_token_ids for r in requests]
    cache = None
    if rows is None:
        input_ids, attention = left_pad(prompts, pad_id, device)
        if kv_reuse_unsafe_reason(model) is None:
            cache = GrowingCache()
    else:
        input_ids, attention, cache = extend(kv, rows, prompts, pad_id, device)
    width = input_ids.shape[1]
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        **{cache_kwarg(model): cache},
        generation_config=config,
        logits_processor=None if sampler is None else [sampler],
        stopping_criteria=None if stopping is None else stopping(width),
    )
    new = out.sequences[:, width:]
    if sampler is not None:
        logprobs = torch.stack(sampler.logprobs, dim=1).cpu()  # [batch, new]: the sampler's own
    else:
        logits = torch.stack(out.logits, dim=1).float()  # [batch, new, vocab]
        if temperature > 0:
            logits = logits / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1).cpu()
    if logprobs.shape != new.shape:
        raise RuntimeError(f"generate returned {tuple(new.shape)} new ids but {tuple(logprobs.shape)} log-probs.")
    new = new.cpu()
    results = [(new[i].tolist(), logprobs[i].tolist()) for i in range(len(prompts))]
    if not keep_kv:
        return results, None
    kept = torch.zeros_like(new)
    seen = []
    for i, (ids, _) in enumerate(results):
        n = stop_len(ids)
        kept[i, :n] = 1
        seen.append(list(prompts[i]) + ids[:n])
    state = KVState(
        sessions=[r.session_id for r in requests],
        seen=seen,
        input_ids=out.sequences,
        attention=torch.cat([attention, kept.to(device)], 1),
        cache=getattr(out, cache_kwarg(model)),
    )
    return results, state


def generate_continuous(model: PreTrainedModel, prompts: list[list[int]], config: GenerationConfig) -> Sampled:
    """transformers continuous batching; log-probabilities come from the manager."""
    from transformers import ContinuousBatchingConfig

    outputs = model.generate_batch(
        inputs=prompts,
        generation_config=config,
        continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True),
        progress_bar=False,
    )
    by_prompt: dict[int, Any] = {}
    for key, o in outputs.items():
        by_prompt[int(str(key).rsplit("_", 1)[-1])] = o
    if sorted(by_prompt) != list(range(len(prompts))):
        raise RuntimeError(
            f"continuous batching returned request ids {sorted(outputs)}; cannot match them to the {len(prompts)} "
            "prompts."
        )
    ordered = [by_prompt[i] for i in range(len(prompts))]
    for o in ordered:
        if o.error:
            raise RuntimeError(f"continuous batching request {o.request_id} failed: {o.error}")
    return [(list(o.generated_tokens), list(o.logprobs)) for o in ordered]
