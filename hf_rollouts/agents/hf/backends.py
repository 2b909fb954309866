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
from .kv_cache import CacheKind, GrowingCache, KVState, cache_kwarg, extend, kv_reuse_unsafe_reason, left_pad
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
    cache_kind: CacheKind = "growing",
) -> tuple[Sampled, KVState | None]:
    """One batched ``generate`` for ``requests``; returns the samples and the cache to keep.

    With ``rows`` (from :func:`~.kv_cache.reusable_rows`) the call continues from ``kv`` and
    prefills only each episode's new ids. With ``keep_kv`` the new cache is returned for the
    next turn; ``stop_len`` gives how many sampled ids of a row are real (up to its stop).
    With ``sampler`` (:class:`~.sampler.RowSampler`, for a greedy ``config``) each row samples from the
    random stream of its own seed, and the sampler reports the log-probabilities (``config`` need not ask for
    ``output_logits``); without it ``config`` samples with torch's global generator and must set
    ``output_logits=True``. ``cache_kind`` (:data:`~.kv_cache.CACHE_KINDS`): with ``growing``, a fresh prefill of a
    full-attention model gets a :class:`~.kv_cache.GrowingCache` (in-place decode steps), other models
    ``generate``'s own cache; ``dynamic``: ``generate``'s own cache; ``static``: ``config`` must ask for
    ``cache_implementation="static"``, and nothing is kept (``keep_kv`` and ``rows`` must be off).
    ``stopping(width)`` gives extra stopping criteria for the call (stop strings), ``width`` being where
    generated ids start.
    """
    if cache_kind == "static" and (keep_kv or rows is not None or config.cache_implementation != "static"):
        raise ValueError(
            "the static cache is not kept between calls: pass keep_kv=False, rows=None and a config with "
            "cache_implementation='static'."
        )
    device = model.device
    prompts = [r.prompt_token_ids for r in requests]
    cache = None
    if rows is None:
        input_ids, attention = left_pad(prompts, pad_id, device)
        if cache_kind == "growing" and kv_reuse_unsafe_reason(model) is None:
            cache = GrowingCache()
    else:
        input_ids, attention, cache = extend(kv, rows, prompts, pad_id, device)
    width = input_ids.shape[1]
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        **({} if cache is None else {cache_kwarg(model): cache}),
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


def paged_cache_config(prompts: list[list[int]], max_new_tokens: int) -> Any:
    """A ``ContinuousBatchingConfig`` with log-probabilities and a paged cache sized to the call: every prompt plus
    ``max_new_tokens``, whole pages each, and at most 8192 tokens a forward. Left to itself transformers sizes the
    cache to 80-90% of the device's free memory; on a CPU that is the machine's RAM, which a shared machine then runs
    out of (the process is killed)."""
    from transformers import ContinuousBatchingConfig

    cb = ContinuousBatchingConfig(return_logprobs=True)
    page = getattr(cb, "page_size", None) or cb.block_size  # page_size since transformers 5.2x, block_size before
    cb.num_blocks = 1 + sum(-(-(len(p) + max_new_tokens) // page) for p in prompts)
    # tokens per forward: transformers' default (8192) or less; given, it is not solved from free memory either
    cb.max_batch_tokens = max(256, min(8192, sum(len(p) for p in prompts)))
    return cb


def generate_continuous(model: PreTrainedModel, prompts: list[list[int]], config: GenerationConfig) -> Sampled:
    """transformers continuous batching; log-probabilities come from the manager."""
    outputs = model.generate_batch(
        inputs=prompts,
        generation_config=config,
        continuous_batching_config=paged_cache_config(prompts, config.max_new_tokens),
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
