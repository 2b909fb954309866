"""The generate backend's per-request seeded sampler: batch-independent draws, top-k and top-p as transformers
keeps them, and one batched set of operations per step whatever the batch size."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import TopKLogitsWarper, TopPLogitsWarper

from hf_rollouts.agents.hf.sampler import RowSampler, truncate

CPU = torch.device("cpu")
SETTINGS = [(0, 1.0), (5, 1.0), (0, 0.7), (5, 0.7), (1, 1.0)]


def _logits(n: int, vocab: int = 300, seed: int = 0) -> torch.Tensor:
    """Peaked rows with a few exact ties, so top-k and top-p both have something to cut."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, vocab, generator=g) * 3
    x[:, 10:14] = x[:, 10:11]  # ties
    return x


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_a_rows_draws_depend_on_its_seed_and_step_only(top_k, top_p):
    """The same requests in batches of different size and order draw the same ids with the same log-probs."""
    steps, logits = 6, [_logits(5, seed=s) for s in range(6)]  # step t, request r: logits[t][r]
    seeds = [11, 12, 13, 14, 15]

    def run(order: list[int]) -> dict[int, list[tuple[int, float]]]:
        sampler = RowSampler([seeds[r] for r in order], 0.9, top_p, CPU, top_k=top_k)
        out: dict[int, list[tuple[int, float]]] = {r: [] for r in order}
        for t in range(steps):
            ids, lps = sampler.sample(logits[t][order])
            for r, i, lp in zip(order, ids.tolist(), lps.tolist()):
                out[r].append((i, lp))
        return out

    full = run([0, 1, 2, 3, 4])
    for order in ([4, 3, 2, 1, 0], [2, 0], [3], [1, 4, 0]):
        for r, draws in run(order).items():
            assert draws == full[r], (order, r)
    assert len({tuple(d) for d in full.values()}) == 5  # different seeds, different streams


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_truncation_keeps_what_transformers_warpers_keep(top_k, top_p):
    scaled = _logits(8) / 0.9
    probs = torch.softmax(scaled, -1)
    kept = truncate(probs, top_k, top_p) > 0
    expected = scaled
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    assert torch.equal(kept, torch.isfinite(expected))
    if top_k and top_p == 1:
        assert (kept.sum(-1) >= top_k).all()  # ties with the k-th are kept, as transformers keeps them


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 1.0), (0, 0.6), (3, 0.9)])
def test_draws_follow_the_truncated_distribution_and_logprobs_are_before_truncation(top_k, top_p):
    row = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    n = 40_000
    sampler = RowSampler(list(range(n)), 1.0, top_p, CPU, top_k=top_k)
    ids, lps = sampler.sample(row.expand(n, -1))
    full = torch.log_softmax(row[0], -1)
    assert torch.allclose(lps, full[ids])  # log_softmax(logits / T) of the chosen id, before truncation
    target = truncate(torch.softmax(row, -1), top_k, top_p)[0]
    target = target / target.sum()
    freq = torch.bincount(ids, minlength=8).double() / n
    assert (freq[target == 0] == 0).all()
    assert torch.allclose(freq, target.double(), atol=0.01)  # 40k draws: ~0.0025 standard error per id


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_one_step_is_the_same_operations_for_any_batch_size(top_k, top_p):
    """No loop over rows: a step of 64 rows runs exactly the tensor operations of a step of 1."""
    counts = []
    for n in (1, 64):
        sampler = RowSampler(list(range(n)), 0.8, top_p, CPU, top_k=top_k)
        scores = _logits(n)
        with _CountOps() as counter:
            sampler.sample(scores)
        counts.append(counter.ops)
    assert counts[0] == counts[1] and counts[0] < 60


def test_top_k_must_not_be_negative():
    with pytest.raises(ValueError, match="top_k"):
        RowSampler([0], 1.0, 1.0, CPU, top_k=-1)


def test_sampling_config_top_k():
    from hf_rollouts.agents.sampling import SamplingConfig

    with pytest.raises(ValueError, match="top_k >= 0"):
        SamplingConfig(top_k=-1)
    assert "top_k" not in SamplingConfig().to_dict()  # off: the cache keys runs had before top-k existed
    assert SamplingConfig(top_k=5).to_dict()["top_k"] == 5


@pytest.mark.parametrize("backend", ["generate", "continuous"])
def test_the_agent_samples_within_the_top_k_and_stores_full_softmax_logprobs(tiny, backend):
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    model, tok = tiny
    if backend == "continuous":  # transformers reports its log-probs after top-k/top-p: refused, never stored
        for truncation in ({"top_k": 3}, {"top_p": 0.5}):
            with pytest.raises(ValueError, match="backend='continuous' with top_p.*Use the generate backend"):
                TransformersAgent(model, tok, temperature=1.0, backend=backend, **truncation)
        return
    agent = TransformersAgent(model, tok, max_new_tokens=1, temperature=1.0, top_k=3, backend=backend)
    prompt = agent.chat.initial_ids([{"role": "user", "content": "Is it a clock?"}])
    results = agent.act_batch([AgentRequest([], prompt, seed=s) for s in range(64)])
    with torch.no_grad():
        logits = model(torch.tensor([prompt], device=model.device)).logits[0, -1].float().cpu()
    full = torch.log_softmax(logits, -1)
    top = set(torch.topk(logits, 3).indices.tolist())
    drawn = {action.token_ids[0] for action, _ in results}
    assert drawn <= top and len(drawn) > 1
    for action, _ in results:  # log_softmax(logits / T) before top-k, as training recomputes it
        assert action.logprobs[0] == pytest.approx(full[action.token_ids[0]].item(), abs=1e-4)
