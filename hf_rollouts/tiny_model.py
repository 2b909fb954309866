"""The embedded default model: a real tokenizer and a tiny Llama, built offline.

No model hub is needed: :func:`build_tiny_model` trains a byte-level BPE on the
text this package ships (``hf_rollouts/data/corpus.txt`` plus the Twenty
Questions knowledge base), wraps it in a ``PreTrainedTokenizerFast`` with pad and
eos tokens and a chat template, and builds a Llama-architecture causal LM with
seeded random weights. Both are saved under a cache directory and, on later
calls, reloaded with ``from_pretrained`` — the same path users take with a real
model id.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from .paths import cache_root

__all__ = ["build_tiny_model", "build_tokenizer", "tiny_model_path", "tiny_reward_model_path"]

BUILD_VERSION = 3  # bump when the recipe changes, so old caches are not reused
PAD, EOS = "<|pad|>", "<|end|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call tools. Their signatures:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call one as <tool_call>\n{"name": <name>, "arguments": <json object>}\n</tool_call><|end|>\n{% endif %}'
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|user|>\n<tool_response>\n{{ message['content'] }}\n</tool_response><|end|>\n"
    "{% else %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% if 'tool_calls' in message and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}{% set call = call.function or call %}"
    '<tool_call>\n{"name": "{{ call.name }}", "arguments": {{ call.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{% endif %}<|end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Plain chat: ``<|role|>\ncontent<|end|>\n``. With tools (Hermes-style, like Qwen2.5): the tool list in a system
block first, calls written ``<tool_call>\n{json}\n</tool_call>`` after an assistant's content, tool results as a
user turn in ``<tool_response>`` tags. Without tools it renders exactly as before. (``'tool_calls' in message``,
not ``message.get(...)``: a method call in the sandboxed template costs every render about a microsecond per
message, which made a plain episode of a fast env about a quarter slower.)"""


@dataclass(frozen=True)
class TinySize:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 1024


SIZES = {
    # for tests and the README demo: builds and runs in a blink on CPU
    "tiny": TinySize(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    # the benchmark's default: big enough that generation dominates
    "small": TinySize(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4
    ),
}


def _training_text() -> list[str]:
    pkg = resources.files("hf_rollouts")
    lines = pkg.joinpath("data/corpus.txt").read_text(encoding="utf-8").splitlines()
    kb_file = pkg.joinpath("envs/twenty_questions/objects.json")
    if kb_file.is_file():
        kb = json.loads(kb_file.read_text(encoding="utf-8"))
        lines += [a["question"] for a in kb["attributes"].values()]
        lines += [f"Is it a {name}?" for group in kb["objects"].values() for name in sorted(group)]
    return [line for line in lines if line.strip()]


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train the deterministic byte-level BPE and wrap it as a HF tokenizer with a chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, additional_special_tokens=ROLE_TOKENS
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.padding_side = "left"
    return hf


def build_tiny_model(
    seed: int = 0, size: str = "tiny", cache_dir: str | Path | None = None
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Return ``(model, tokenizer)`` for the embedded default model.

    Built once per ``(seed, size)`` under ``cache_dir`` (default
    :func:`hf_rollouts.paths.cache_root`) and reloaded from there with ``from_pretrained``.
    The result is deterministic: the same seed gives the same weights and vocabulary.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}.")
    path = tiny_model_path(seed, size, cache_dir)
    if not (path / "config.json").is_file():
        tokenizer, config = _tiny_config(size, tie_word_embeddings=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
        _save_atomically(model, tokenizer, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config._name_or_path = tiny_model_name(seed, size)
    return model, tokenizer


def tiny_model_name(seed: int = 0, size: str = "tiny") -> str:
    """The model's ``_name_or_path`` (the agent's name in fingerprints and dataset cards)."""
    return f"hf_rollouts/tiny-{size}-seed{seed}"


def tiny_model_path(seed: int = 0, size: str = "tiny", cache_dir: str | Path | None = None) -> Path:
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return root / f"tiny-v{BUILD_VERSION}-{size}-seed{seed}"


def tiny_reward_model_path(seed: int = 0, cache_dir: str | Path | None = None) -> Path:
    """A folder holding a tiny reward model with seeded random weights (``LlamaForSequenceClassification``,
    ``num_labels=1``, the tiny model's shape) and the tiny tokenizer (left padding, its chat template), built once:
    what TRL's ``reward_funcs`` and the ``reward_model`` verifier load by path, for tests and examples."""
    from transformers import LlamaForSequenceClassification

    path = tiny_model_path(seed, "tiny", cache_dir).with_name(f"tiny-v{BUILD_VERSION}-reward-seed{seed}")
    if not (path / "config.json").is_file():
        tokenizer, config = _tiny_config("tiny", num_labels=1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForSequenceClassification(config)
            torch.nn.init.normal_(model.score.weight, std=0.5)  # scores that differ visibly between replies
        _save_atomically(model, tokenizer, path)
    return path


def _tiny_config(size: str, **extra: object) -> tuple[PreTrainedTokenizerFast, LlamaConfig]:
    """The tiny tokenizer and a Llama config of ``size``'s shape over its vocabulary (``extra``: more config fields)."""
    spec = SIZES[size]
    tokenizer = build_tokenizer(spec.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **extra,
    )
    return tokenizer, config


def _save_atomically(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Save into a temporary sibling, then rename: concurrent builders (several processes) never see half a model."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:  # another process renamed its copy first
        shutil.rmtree(tmp, ignore_errors=True)
