"""Per-request seeded sampling inside one batched ``model.generate``.

:class:`RowSampler` is a logits processor that draws each row's next token from
``softmax(logits / T)`` (restricted to the ``top_k`` most likely ids, then to the nucleus ``top_p``, in
transformers' order) with a uniform number that is a pure function of the row's seed and the step: a
counter-based generator (splitmix64 over ``seed`` and ``step``), then inverse-CDF sampling. Every step is
one batched set of tensor operations over all rows (no Python loop over rows, no host synchronisation).
It hands ``generate`` a one-hot choice that its greedy step takes. So a request's draws depend on its seed
and the step alone: not on which requests share its batch, their order, or the global torch RNG (which
hf_rollouts never touches on this path). (Gumbel-max over counter-based noise was measured as the
alternative: it hashes every vocabulary entry, ``batch x vocab`` 64-bit hashes and two logarithms a step,
and was slower on CPU than this cumulative sum; see ``tests/test_kv_cache.py``.)

The distribution is exactly the one the stored log-probabilities describe (``log_softmax(logits / T)``
of the raw logits, before top-k and top-p), the same as transformers' own sampling. The sampler keeps
that log-probability of each chosen id (:attr:`RowSampler.logprobs`), computed from the same scaled logits it
samples from, so ``generate`` need not hand back every step's full-vocabulary logits (``output_logits``: at
batch 32, 32 new tokens and a 49k vocabulary that is 200 MB per call, and 10 GB at batch 64, 256 tokens, 150k).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer
_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_M2 = -7723592293110705685  # 0x94D049BB133111EB


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def uniforms(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One uniform float64 in ``[0, 1)`` per seed: splitmix64 of ``seed * golden + step + 1`` (int64 arithmetic
    wraps as in C), its top 53 bits."""
    x = seeds * _GOLDEN + (step + 1)
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    x = x ^ _shr(x, 31)
    return _shr(x, 11).to(torch.float64) / float(1 << 53)


class RowSampler(LogitsProcessor):
    """Samples row ``i`` with the counter-based stream of ``seeds[i]``; returns ``0`` on the chosen id, ``-inf``
    elsewhere (use with greedy decoding: ``do_sample=False``, and as the only logits processor, so ``scores``
    are the raw logits).

    ``logprobs[t][i]`` is ``log_softmax(scores / T)`` of the id chosen for row ``i`` at step ``t`` (float32).
    """

    def __init__(
        self, seeds: list[int], temperature: float, top_p: float, device: torch.device, top_k: int = 0
    ) -> None:
        if temperature <= 0:
            raise ValueError("RowSampler samples; use plain greedy decoding for temperature 0.")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}.")
        self.seeds, self.temperature, self.top_p, self.top_k = [int(s) for s in seeds], temperature, top_p, top_k
        self.device = torch.device(device)
        self._seeds = torch.tensor(self.seeds, dtype=torch.int64, device=self.device)
        self.step = 0
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        chosen, logprob = self.sample(scores)
        self.logprobs.append(logprob)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen.unsqueeze(1), 0.0)
        return out

    def sample(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw this step's id of every row from ``softmax(scores / T)`` (``top_k``, then nucleus ``top_p``); returns
        the ids ``[batch]`` and their ``log_softmax(scores / T)`` ``[batch]``, and advances the step."""
        scaled = scores.float() / self.temperature
        log_norm = torch.logsumexp(scaled, dim=-1, keepdim=True)
        probs = torch.exp(scaled - log_norm)
        probs = truncate(probs, self.top_k, self.top_p)
        cdf = torch.cumsum(probs.double(), dim=-1)
        u = uniforms(self._seeds, self.step).unsqueeze(1) * cdf[:, -1:]
        self.step += 1
        # the first id whose cumulative mass exceeds u: never an id of probability 0
        chosen = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)
        return chosen.squeeze(1), (scaled.gather(1, chosen) - log_norm).squeeze(1)


def truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``probs`` with every id outside the ``top_k`` most likely (ties with the k-th kept; 0: no limit) and then
    outside the nucleus ``top_p`` of what is left set to 0, as transformers' ``TopKLogitsWarper`` then
    ``TopPLogitsWarper`` do: the smallest set of most likely ids whose (renormalised) mass reaches ``top_p``, at
    least one. One sort of each row, for all rows at once."""
    use_k = 0 < top_k < probs.shape[-1]
    if not use_k and top_p >= 1.0:
        return probs
    if use_k and top_p >= 1.0:  # top-k alone: no sort of the whole row
        kth = torch.topk(probs, top_k, dim=-1).values[..., -1:]
        return probs * (probs >= kth)
    sorted_probs, order = torch.sort(probs, descending=True, dim=-1)
    limit: float | torch.Tensor = top_p
    if use_k:
        sorted_probs = sorted_probs * (sorted_probs >= sorted_probs[..., top_k - 1 : top_k])
        limit = top_p * sorted_probs.sum(-1, keepdim=True)  # the nucleus of the renormalised top-k
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of the kept ids ranked above each one
    keep_sorted = before < limit
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return probs * keep
