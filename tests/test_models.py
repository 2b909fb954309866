"""The embedded default model: a real HF tokenizer and Llama, deterministic, cached, reloaded."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from hf_rollouts.tiny_model import build_tiny_model, tiny_model_path


def test_tiny_model_is_real_and_deterministic(tmp_path):
    model, tok = build_tiny_model(seed=1, cache_dir=tmp_path / "a")
    assert isinstance(model, LlamaForCausalLM) and isinstance(tok, PreTrainedTokenizerFast)
    assert tok.pad_token_id is not None and tok.eos_token_id is not None and tok.chat_template
    assert (tiny_model_path(1, "tiny", tmp_path / "a") / "config.json").is_file()
    other_model, other_tok = build_tiny_model(seed=1, cache_dir=tmp_path / "b")  # built afresh elsewhere
    assert tok.get_vocab() == other_tok.get_vocab()
    for p, q in zip(model.parameters(), other_model.parameters()):
        assert torch.equal(p, q)
    different, _ = build_tiny_model(seed=2, cache_dir=tmp_path / "a")
    assert not torch.equal(next(model.parameters()), next(different.parameters()))


def test_second_call_reloads_from_the_cache(tmp_path):
    build_tiny_model(seed=0, cache_dir=tmp_path)
    path = tiny_model_path(0, "tiny", tmp_path)
    stamp = (path / "config.json").stat().st_mtime_ns
    model, tok = build_tiny_model(seed=0, cache_dir=tmp_path)
    assert (path / "config.json").stat().st_mtime_ns == stamp  # not rebuilt
    ids = tok.apply_chat_template([{"role": "user", "content": "Is it a clock?"}], add_generation_prompt=True)[
        "input_ids"
    ]
    assert tok.decode(ids) == "<|user|>\nIs it a clock?<|end|>\n<|assistant|>\n"
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))
