"""The generate backend's own parts: the in-place KV cache and the sampler's log-probabilities."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, GenerationConfig

from hf_rollouts.agents.hf.backends import generate_padded
from hf_rollouts.agents.hf.kv_cache import GrowingCache, GrowingLayer, cache_kwarg, default_cache_kind
from hf_rollouts.agents.hf.sampler import RowSampler
from hf_rollouts.types import AgentRequest


def _greedy(model, ids, mask, cache, steps):
    config = GenerationConfig(
        do_sample=False, max_new_tokens=steps, min_new_tokens=steps, output_logits=True, return_dict_in_generate=True,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    with torch.inference_mode():
        return model.generate(
            input_ids=ids, attention_mask=mask, **{cache_kwarg(model): cache}, generation_config=config
        )


def test_growing_cache_gives_dynamic_caches_values_bit_for_bit(tiny):
    """Across capacity growth, a row selection and a continuation, attention sees the same keys and values."""
    model = tiny[0]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(tiny[1]), (4, 30), generator=generator).to(model.device)
    mask = torch.ones_like(ids)
    mask[:2, :9] = 0  # left padding
    steps = GrowingLayer._GROW_MIN + 40  # past the first capacity: the buffers are reallocated mid-generation
    runs = {}
    for kind in (DynamicCache, GrowingCache):
        out = _greedy(model, ids, mask, kind(), steps)
        cache = getattr(out, cache_kwarg(model))
        assert type(cache) is kind
        # two episodes go on, as in a kept cache's next turn
        cache.batch_select_indices(torch.tensor([3, 0], device=model.device))
        more = torch.cat([out.sequences[[3, 0]], ids[:2, :5]], 1)
        more_mask = torch.ones_like(more)
        more_mask[1, :9] = 0
        again = _greedy(model, more, more_mask, cache, 12)
        runs[kind] = (out, again)
    (a, a2), (b, b2) = runs[DynamicCache], runs[GrowingCache]
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a2.sequences, b2.sequences)
    for x, y in zip(a.logits + a2.logits, b.logits + b2.logits):
        assert torch.equal(x, y)
    key = cache_kwarg(model)
    layer = getattr(b2, key).layers[0]
    assert isinstance(layer, GrowingLayer) and layer._k.shape[-2] > layer.keys.shape[-2]  # spare room kept
    assert getattr(b2, key).get_seq_length() == getattr(a2, key).get_seq_length()


def test_growing_cache_crop_and_reset(tiny):
    cache = GrowingCache()
    k = torch.randn(2, 2, 7, 4)
    cache.update(k, k + 1, 0)
    cache.layers[0].crop(-3)
    assert cache.get_seq_length() == 4 and torch.equal(cache.layers[0].keys, k[:, :, :4])
    keys, values = cache.update(k[:, :, :1], k[:, :, :1] + 1, 0)
    assert torch.equal(keys, torch.cat([k[:, :, :4], k[:, :, :1]], 2)) and torch.equal(values, keys + 1)
    with pytest.raises(ValueError, match="negative"):
        cache.layers[0].crop(2)
    cache.layers[0].reset()
    assert cache.get_seq_length() == 0


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_the_samplers_logprobs_are_log_softmax_of_the_raw_logits(tiny, top_p):
    """What the sampler reports is what the old path computed from output_logits: log_softmax(logits / T) of the
    sampled id, before top-p."""
    model, tok = tiny
    temperature = 0.7
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    sampler = RowSampler([1, 2], temperature, top_p, model.device)
    config = GenerationConfig(
        do_sample=False, max_new_tokens=6, output_logits=True, return_dict_in_generate=True,
        pad_token_id=tok.pad_token_id, eos_token_id=[tok.eos_token_id],
    )  # fmt: skip
    requests = [AgentRequest([], p, session_id=str(i)) for i, p in enumerate(prompts)]
    seen = {}
    real_generate = model.generate

    def spy(**kwargs):
        seen["out"] = out = real_generate(**kwargs)
        return out

    model.generate = spy
    try:
        sampled, _ = generate_padded(
            model, requests, config, temperature=temperature, pad_id=tok.pad_token_id, kv=None, rows=None,
            keep_kv=False, stop_len=len, sampler=sampler,
        )  # fmt: skip
    finally:
        del model.generate
    out = seen["out"]
    logits = torch.stack(out.logits, 1).float() / temperature
    new = out.sequences[:, -logits.shape[1] :]
    expected = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    for i, (ids, logprobs) in enumerate(sampled):
        assert ids == new[i].tolist()
        live = len(ids) if tok.eos_token_id not in ids else ids.index(tok.eos_token_id) + 1
        assert logprobs[:live] == pytest.approx(expected[i, :live].tolist(), abs=1e-5)


def test_each_device_gets_its_measured_cache():
    assert default_cache_kind("cpu") == "growing" and default_cache_kind(torch.device("cuda", 0)) == "dynamic"


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_static_and_dynamic_caches_give_the_growing_caches_tokens(tiny, tokenizer, temperature, monkeypatch):
    """The decode caches are interchangeable: same sampled ids (greedy and seeded), same log-probs up to summation
    order. The static one (what CUDA compiles into graphs) runs eagerly on CPU: never compiled here."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.envs.mastermind import MastermindEnv

    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile called on CPU")

    monkeypatch.setattr(torch, "compile", no_compile)
    model, used = tiny[0], []
    real_generate = model.generate

    def spy(**kwargs):
        out = real_generate(**kwargs)
        used.append(type(getattr(out, cache_kwarg(model))).__name__)
        return out

    tasks = [{"code": [1, 2, 3, 4]}, {"code": [6, 5, 4, 3]}, {"code": [2, 2, 2, 2]}]
    runs, agents = {}, {}
    monkeypatch.setattr(model, "generate", spy)
    for kind in ("growing", "dynamic", "static"):
        agent = TransformersAgent(model, tokenizer, max_new_tokens=6, temperature=temperature, seed=3, cache=kind)
        runs[kind] = MastermindEnv(tokenizer, {"max_turns": 3}).run_trial(tasks, agent, 2)
        agents[kind] = agent
        assert set(used) == {dict(growing="GrowingCache", dynamic="DynamicCache", static="StaticCache")[kind]}
        used.clear()
    assert agents["growing"].kv_reused_calls > 0 and agents["dynamic"].kv_reused_calls > 0
    assert agents["static"].kv_reused_calls == 0 and not agents["static"].reuse_kv  # sized per call, never kept
    assert agents["static"].fingerprint()["sampling"]["cache"] == "static"
    assert agents["growing"].fingerprint()["sampling"]["cache"] == "growing"  # a forced cache is recorded
    default = TransformersAgent(model, tokenizer, max_new_tokens=6, temperature=temperature, seed=3)
    assert "cache" not in default.fingerprint()["sampling"]  # auto: the keys runs had before caches were chosen
    base = runs["growing"]
    for kind in ("dynamic", "static"):
        assert runs[kind]["padded_full_token_ids"] == base["padded_full_token_ids"], kind
        for a, b in zip(runs[kind]["padded_logprobs"], base["padded_logprobs"]):
            assert a == pytest.approx(b, abs=1e-4), kind


def test_the_static_cache_is_never_kept(tiny):
    model, tok = tiny
    config = GenerationConfig(max_new_tokens=2, cache_implementation="static", return_dict_in_generate=True)
    with pytest.raises(ValueError, match="not kept"):
        generate_padded(
            model, [AgentRequest([], [5, 6])], config, temperature=0, pad_id=tok.pad_token_id, kv=None, rows=None,
            keep_kv=True, stop_len=len, cache_kind="static",
        )  # fmt: skip


def test_the_continuous_backends_paged_cache_is_sized_to_the_call(tiny):
    """Left to itself transformers sizes the paged cache to ~90% of free memory: on a CPU, the machine's RAM (a
    shared machine killed the process). Each prompt gets the whole pages its prompt and new tokens need."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.agents.hf.backends import paged_cache_config

    cb = paged_cache_config([[1] * 300, [2] * 10], 20)
    page = getattr(cb, "page_size", None) or cb.block_size
    assert page == 256 and cb.num_blocks == 1 + 2 + 1 and cb.max_batch_tokens == 310 and cb.return_logprobs
    model, tok = tiny
    agent = TransformersAgent(model, tok, max_new_tokens=3, backend="continuous")
    seen = {}
    real = model.generate_batch

    def spy(**kwargs):
        seen.update(kwargs)
        return real(**kwargs)

    model.generate_batch = spy
    try:
        assert not isinstance(agent.act_batch([AgentRequest([], [5, 6, 7])])[0], Exception)
    finally:
        del model.generate_batch
    assert seen["continuous_batching_config"].num_blocks == 2
    assert seen["continuous_batching_config"].max_batch_tokens == 256
