"""scripts/benchmark.py's hardware bounds: per-token costs from the model, forwards from the recorded generate calls,
and the memory, compute and roofline times, checked against hand computation (timings themselves are not tested)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_script", ROOT / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["benchmark_script"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("benchmark_script", None)


def test_model_cost_counts_tied_embeddings_once_and_kv_heads(bench, tiny):
    model, c = tiny[0], tiny[0].config
    cost = bench.ModelCost.of(model)
    n = sum(p.numel() for p in model.parameters())  # tied: the table is one parameter
    head_dim = c.hidden_size // c.num_attention_heads
    assert cost.weight_bytes == 4 * n
    assert cost.matmul_flops_per_token == 2 * n  # the tied table is the LM head's matmul
    assert cost.kv_bytes_per_position == 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 4
    assert cost.attention_flops_per_position == 4 * c.num_hidden_layers * c.num_attention_heads * head_dim

    config = LlamaConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    untied = LlamaForCausalLM(config).to(torch.bfloat16)
    cost = bench.ModelCost.of(untied)
    n = sum(p.numel() for p in untied.parameters())
    assert cost.weight_bytes == 2 * n and cost.matmul_flops_per_token == 2 * (n - 100 * 16)  # no lookup matmul
    assert cost.kv_bytes_per_position == 2 * 2 * 2 * 4 * 2


def test_workload_bound_by_hand(bench):
    cost = bench.ModelCost(weight_bytes=100, kv_bytes_per_position=10, matmul_flops_per_token=1000.0,
                           attention_flops_per_position=2.0)  # fmt: skip
    calls = [
        {"input_ids": torch.zeros(2, 5), "held": 0, "steps": 3},  # a fresh prefill, then 2 decode steps
        {"input_ids": torch.zeros(1, 8), "held": 6, "steps": 1},  # 2 new ids on a kept cache, no decode step
    ]
    forwards = bench.forwards_of(calls)
    assert forwards == [(2, 5, 5), (2, 1, 6), (2, 1, 7), (1, 2, 8)]
    bound = bench.workload_bound(cost, forwards, bandwidth=10.0, flops=100.0)
    # memory: (100 + rows * read * 10) / 10; compute: rows * new * (1000 + read * 2) / 100
    assert bound.memory_s == pytest.approx(20 + 22 + 24 + 18)
    assert bound.compute_s == pytest.approx(101 + 20.24 + 20.28 + 20.32)
    assert bound.roofline_s == pytest.approx(101 + 22 + 24 + 20.32) and bound.forwards == 4


def test_bounds_of_a_recorded_run_print(bench, tiny, capsys):
    """The whole path (on the CPU here, on CUDA on a GPU machine): record an agent's generate calls, measure the
    device, print the bounds."""
    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.types import AgentRequest

    agent = TransformersAgent(tiny[0], tiny[1], max_new_tokens=4, cache="growing")  # on the test machine's device
    log = bench.CallLog(agent.model)
    try:
        agent.act_batch([AgentRequest([], [5, 6, 7], session_id="a"), AgentRequest([], [8, 9], session_id="b")])
    finally:
        log.close()
    assert [c["input_ids"].shape for c in log.calls] == [(2, 3)] and log.calls[0]["held"] == 0
    bench.print_bounds("generate", agent.model, log.calls, tokens=8, seconds=1.0)
    out = capsys.readouterr().out
    assert "copy bandwidth" in out and "memory bandwidth" in out and "% of the roofline" in out
