"""The batched KV cache kept between turns: when reuse is exact, which rows to reuse, how to extend them.

Between turns only each episode's new ids (the environment's delta) need a prefill: the
previous call's cache already holds everything before. Reuse is exact for full attention,
which ignores masked keys; the kept cache has masked columns (holes between episodes'
deltas, ids sampled after a stop), so sliding windows and recurrent state rule it out.

The cache itself is a :class:`GrowingCache` where that is exact (the same models): transformers'
``DynamicCache`` appends each decode step with ``torch.cat``, copying every layer's whole cache once per
new token (for SmolLM2-135M at batch 32 and 400 cached positions, about 0.6 GB of copies per step, ~15% of a
decode step on CPU); a :class:`GrowingCache` writes each step in place into spare capacity.

Which cache a call uses is chosen per device (:func:`default_cache_kind`, overridable): see :data:`CACHE_KINDS`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from ...types import AgentRequest

CacheKind = Literal["growing", "dynamic", "static"]
CACHE_KINDS: tuple[str, ...] = ("growing", "dynamic", "static")
"""The decode caches of the ``generate`` backend:

* ``growing``: :class:`GrowingCache`, in-place writes into spare capacity, kept between turns (only each episode's
  new ids are prefilled). Fastest measured on CPU (``scripts/benchmark.py`` (b)/(d)); on CUDA its attention over
  strided views ran 2.5x slower than a plain loop (issue 25, SmolLM2-135M shape, batch 512).
* ``dynamic``: transformers' ``DynamicCache`` (a ``torch.cat`` per step), kept between turns.
* ``static``: transformers' ``StaticCache`` (``cache_implementation="static"``), sized to the batch and the longest
  call so far; fixed shapes, so on CUDA ``generate`` compiles the decode step (``torch.compile``,
  ``mode="reduce-overhead"``: CUDA graphs, one launch a step instead of one per kernel). Not kept between turns:
  each turn prefills its whole prompt (one batched forward, cheap on a GPU next to the decode steps).
  On CPU nothing is compiled (transformers compiles on accelerators only); the path is the same otherwise.
"""

_CACHE_BY_DEVICE: dict[str, str] = {"cpu": "growing"}
"""Measured choices; a device type not listed gets ``dynamic``."""


def default_cache_kind(device: torch.device | str) -> str:
    """The decode cache for ``device``: ``growing`` on CPU (measured fastest there); ``dynamic`` (transformers' own
    cache, kept between turns) on CUDA and other accelerators, where the strided ``growing`` cache was measured 2.5x
    slower than plain ``generate`` for a 135M-shaped model (H200). ``static`` (CUDA graphs) is opt-in until a GPU run
    measures it: ``generate`` compiles it per batch and cache shape, and a rollout's shapes change every turn."""
    return _CACHE_BY_DEVICE.get(torch.device(device).type, "dynamic")


def cache_kwarg(model: PreTrainedModel) -> str:
    """The keyword ``model`` (and its ``generate``) takes a KV cache by: ``cache`` since transformers renamed
    ``past_key_values`` (5.2x, which warns on the old name), ``past_key_values`` before (vLLM's pinned 5.19)."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def kv_reuse_unsafe_reason(model: PreTrainedModel) -> str | None:
    """Why keeping the batched KV cache between turns would change results for ``model``, or None."""
    config = model.config
    text = getattr(config, "get_text_config", lambda: config)()
    if getattr(model, "_is_stateful", False):
        return "the model keeps recurrent state, which would read the masked padding"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) is not False:
        return f"sliding-window attention (window {text.sliding_window}) would count masked columns"
    if any(t != "full_attention" for t in (getattr(text, "layer_types", None) or [])):
        return "some layers are not full attention"
    return None


@dataclass
class KVState:
    """The batched KV cache of the last ``generate`` call, kept for the episodes' next turn.

    Row ``i`` holds session ``sessions[i]``; ``seen[i]`` are the ids the model has read or
    sampled for it (the stored sequence so far). ``input_ids``/``attention`` are the cache's
    layout: left padding, masked holes where shorter rows' deltas were padded, and masked
    ids sampled after a row's stop token. Positions come from ``attention.cumsum()``, so a
    row's tokens keep exactly the positions they have in its stored sequence.
    """

    sessions: list[str]
    seen: list[list[int]]
    input_ids: torch.Tensor
    attention: torch.Tensor
    cache: Any


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and their attention mask (never inferred from pad ids)."""
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, x in enumerate(seqs):
        if x:
            ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            mask[i, width - len(x) :] = 1
    return ids.to(device), mask.to(device)


def reusable_rows(state: KVState | None, requests: list[AgentRequest]) -> list[int] | None:
    """Rows of the kept cache for ``requests``, or None when a full prefill is needed.

    Reuse needs every request's session in the cache, once, with a prompt that strictly
    extends what the model already saw for it (token-in: checked id by id).
    """
    if state is None:
        return None
    row_of = {s: i for i, s in enumerate(state.sessions)}
    rows: list[int] = []
    for r in requests:
        i = row_of.get(r.session_id) if r.session_id else None
        if i is None or i in rows:
            return None
        seen = state.seen[i]
        if len(r.prompt_token_ids) <= len(seen) or r.prompt_token_ids[: len(seen)] != seen:
            return None
        rows.append(i)
    return rows


def extend(
    state: KVState, rows: list[int], prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Inputs for the next call from the kept cache: keep ``rows`` (dropping finished episodes)
    and append each row's new ids as a left-padded block whose holes are masked."""
    input_ids, attention, cache = state.input_ids, state.attention, state.cache
    if rows != list(range(len(state.sessions))):
        index = torch.tensor(rows, device=device)
        cache.batch_select_indices(index)
        input_ids, attention = input_ids[index], attention[index]
    block, block_mask = left_pad([p[len(state.seen[r]) :] for p, r in zip(prompts, rows)], pad_id, device)
    return torch.cat([input_ids, block], 1), torch.cat([attention, block_mask], 1), cache


class GrowingLayer(DynamicLayer):
    """A full-attention layer cache that keeps spare capacity and writes new keys/values in place.

    ``keys``/``values`` are views ``[batch, heads, :length, head_dim]`` of buffers with room for more columns;
    the buffers grow by half (at least 64 columns) when full, so a decode step costs a write of one column
    instead of a copy of the whole cache. The values attention sees are exactly those of a ``DynamicLayer``.
    """

    _GROW_MIN = 64

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self._n + key_states.shape[-2]
        capacity = 0 if self._k is None else self._k.shape[-2]
        if n > capacity:
            capacity = max(n + self._GROW_MIN, capacity + capacity // 2)
            k = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[-1]))
            v = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[-1]))
            if self._n:
                k[:, :, : self._n] = self._k[:, :, : self._n]
                v[:, :, : self._n] = self._v[:, :, : self._n]
            self._k, self._v = k, v
        self._k[:, :, self._n : n] = key_states
        self._v[:, :, self._n : n] = value_states
        self._n = n
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._n:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._n:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self._n:
            self.batch_select_indices(beam_idx.to(self._k.device))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}.")
        if tokens_to_remove and self.is_initialized:
            self._n = max(0, self._n + tokens_to_remove)
            self._views()

    def reset(self) -> None:
        """Drop the cached columns (the next ``update`` starts afresh). Done here, not left to ``DynamicLayer``:
        transformers before 5.2x only zeroes the tensors in place, which keeps their length."""
        self._k = self._v = None
        self._n = 0
        self.keys = self.values = None
        self.is_initialized = False  # so the base class zeroes nothing and only resets its counters
        super().reset()

    def offload(self) -> None:
        raise NotImplementedError("GrowingLayer does not offload; use transformers' DynamicCache(offloading=True).")


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` whose layers are :class:`GrowingLayer`s (for full-attention models only: see
    :func:`kv_reuse_unsafe_reason`, which also decides where this cache is used)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
