"""Build an agent from a model spec string, as the CLI and scripts spell it.

* ``tiny`` / ``tiny-small`` — the embedded model (:func:`hf_rollouts.tiny_model.build_tiny_model`),
  built offline; ``tiny`` for tests and demos, ``tiny-small`` (4 layers, 256 wide) for benchmarks.
* ``openai:BASE_URL#MODEL`` — an OpenAI-compatible endpoint (:class:`~.openai.OpenAIChatAgent`);
  ``tokenizer`` names the served model's tokenizer (default: ``MODEL``), which the env uses.
  The agent negotiates token mode or chat mode with the server on first use.
* ``vllm:ID_OR_PATH`` — vLLM's engine in this process (:class:`~.vllm.VLLMAgent`; needs a Python with vLLM,
  see ``scripts/setup_vllm.sh``); ``engine`` holds :class:`~.vllm.VLLMSettings` fields and other vLLM engine
  arguments.
* anything else — a hub id or local path, loaded with ``from_pretrained``.
"""

from __future__ import annotations

from typing import Any

from .base import Agent
from .hf import TransformersAgent
from .sampling import SamplingConfig

TINY_SPECS = {"tiny": "tiny", "tiny-small": "small"}


def load_agent(
    spec: str,
    sampling: SamplingConfig | None = None,
    *,
    seed: int = 0,
    model_seed: int = 0,
    backend: str = "generate",
    reuse_kv: bool = True,
    tokenizer: str | None = None,
    trust_remote_code: bool = False,
    endpoint: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
) -> Agent:
    """Return the agent for ``spec`` (see module docstring).

    ``seed`` seeds sampling (an endpoint's per-request seeds); ``backend`` and ``reuse_kv``
    are :class:`~.hf.TransformersAgent` options. ``endpoint`` holds extra
    :class:`~.openai.OpenAISettings` fields (concurrency,
    timeout, max_retries, ...) for ``openai:`` specs; ``engine`` holds :class:`~.vllm.VLLMSettings` fields
    (``dtype``, ``gpu_memory_utilization``, ``tensor_parallel_size``, ``logprobs_mode``, ...) and any other vLLM
    engine argument for ``vllm:`` specs (``seed`` and ``tokenizer`` apply too).
    """
    sampling = sampling or SamplingConfig()
    if spec in TINY_SPECS:
        from ..tiny_model import build_tiny_model

        model, tok = build_tiny_model(seed=model_seed, size=TINY_SPECS[spec])
        return TransformersAgent(
            model, tok, sampling, seed=seed, backend=backend, reuse_kv=reuse_kv, name=model.config._name_or_path
        )
    if spec.startswith("openai:"):
        from transformers import AutoTokenizer

        from .openai import OpenAIChatAgent, parse_openai_spec

        tok = AutoTokenizer.from_pretrained(
            tokenizer or parse_openai_spec(spec)[1], trust_remote_code=trust_remote_code
        )
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return OpenAIChatAgent.from_spec(spec, sampling=sampling, tokenizer=tok, seed=seed, **(endpoint or {}))
    if spec.startswith("vllm:"):
        from .vllm import VLLMAgent, VLLMSettings, parse_vllm_spec

        options = {"seed": seed, "tokenizer": tokenizer, "trust_remote_code": trust_remote_code, **(engine or {})}
        return VLLMAgent(VLLMSettings.from_dict(parse_vllm_spec(spec), options), sampling=sampling)
    return TransformersAgent.from_pretrained(
        spec, sampling=sampling, seed=seed, backend=backend, reuse_kv=reuse_kv, trust_remote_code=trust_remote_code
    )
