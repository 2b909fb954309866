"""Per-request seeded sampling inside one batched ``model.generate``.

:class:`RowSampler` is a logits processor that draws each row's next token with that row's own
``torch.Generator`` (seeded by the request's seed), from ``softmax(logits / T)`` restricted to the
nucleus ``top_p``, and hands ``generate`` a one-hot choice that its greedy step takes. So a request's
random draws depend on its seed alone: not on which requests share its batch, their order, or the
global torch RNG (which hf_rollouts never touches on this path).

The distribution is exactly the one the stored log-probabilities describe (``log_softmax(logits / T)``
of the raw logits, before top-p), the same as transformers' own sampling with ``top_k=0``.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor


class RowSampler(LogitsProcessor):
    """Samples row ``i`` with ``torch.Generator().manual_seed(seeds[i])``; returns ``0`` on the chosen id, ``-inf``
    elsewhere (use with greedy decoding: ``do_sample=False``)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, device: torch.device) -> None:
        if temperature <= 0:
            raise ValueError("RowSampler samples; use plain greedy decoding for temperature 0.")
        self.seeds, self.temperature, self.top_p = list(seeds), temperature, top_p
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in self.seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = _nucleus(probs, self.top_p)
        chosen = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, self.generators)])
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen.unsqueeze(1), 0.0)
        return out


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely ids whose mass reaches ``top_p`` (at least one), as transformers'
    ``TopPLogitsWarper`` does; the rest get probability 0."""
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the ids ranked above each one
    keep_sorted = before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep
