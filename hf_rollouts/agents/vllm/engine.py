"""Building, configuring and shutting down vLLM's engine for :class:`~.agent.VLLMAgent`.

The import of vLLM and the build of its ``AsyncLLMEngine`` run on the engine loop (:mod:`hf_rollouts.aio`), where the
agent awaits every request; on vLLM's CPU backend the build adjusts two engine settings (:func:`build_engine`). The
model's tokenizer, its ``generation_config`` eos ids and a digest of its files (the fingerprint's) are read here too,
without vLLM.
"""

from __future__ import annotations

import hashlib
import os
from types import SimpleNamespace
from typing import Any

from ...aio import ENGINE_LOOP
from .settings import SETUP_HINT, VLLMSettings, VLLMUnavailableError


def import_vllm() -> SimpleNamespace:
    """vLLM's version and the classes the agent uses, or :class:`VLLMUnavailableError` saying how to set it up.

    The agent calls it on the engine loop (see :meth:`VLLMAgent._start`): importing vLLM's modules keeps the
    frames of the importing stack alive (a reference held inside vLLM or torch at import time), so the import must
    not run in a frame that holds the agent, or the agent and its engine would never be freed.
    """
    try:
        import vllm
        from vllm import AsyncEngineArgs, AsyncLLMEngine, SamplingParams, TokensPrompt
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind
    except ImportError as exc:
        raise VLLMUnavailableError(f"{SETUP_HINT} ({type(exc).__name__}: {exc})") from exc
    return SimpleNamespace(
        version=str(vllm.__version__),
        AsyncEngineArgs=AsyncEngineArgs,
        AsyncLLMEngine=AsyncLLMEngine,
        SamplingParams=SamplingParams,
        TokensPrompt=TokensPrompt,
        FINAL_ONLY=RequestOutputKind.FINAL_ONLY,
        on_cpu=bool(current_platform.is_cpu()),
    )


def vllm_installed() -> bool:
    """Whether ``import vllm`` can find vLLM in this Python (a cheap check: nothing is imported)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def load_tokenizer(settings: VLLMSettings) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        settings.tokenizer or settings.model, revision=settings.revision, trust_remote_code=settings.trust_remote_code
    )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def generation_eos(settings: VLLMSettings) -> int | list[int] | None:
    """The model's ``generation_config.eos_token_id`` (an int or a list), or ``None`` when it ships none."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(settings.model, revision=settings.revision).eos_token_id
    except (OSError, ValueError):
        return None


def model_files_identity(settings: VLLMSettings) -> str | None:
    """A digest that changes when the model's files change: for a local directory, its files' names, sizes and
    modification times; for a hub id, the commit of the cached snapshot. ``None`` when neither is known."""
    path = settings.model
    if os.path.isdir(path):
        digest = hashlib.sha256()
        for root, _, names in sorted(os.walk(path)):
            for name in sorted(names):
                full = os.path.join(root, name)
                st = os.stat(full)
                digest.update(f"{os.path.relpath(full, path)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        return digest.hexdigest()[:16]
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(path, "config.json", revision=settings.revision)
    except Exception:
        return None
    if isinstance(found, str) and "/snapshots/" in found:
        return found.split("/snapshots/")[1].split("/")[0]
    return None


async def imported_vllm() -> SimpleNamespace:
    """:func:`import_vllm` as a coroutine, for the engine loop (why there: :func:`import_vllm`)."""
    return import_vllm()


CPU_BLOCK_SIZE = 32
"""KV-cache block size (tokens) on vLLM's CPU backend when none is given: the smallest its attention kernel takes
(``MultipleOf(32)``). vLLM 0.32's CPU default, 128, caches only whole 128-token blocks, so an episode's next turn
rarely reuses its own prefix: measured here with the tiny-small model, 64 Mastermind episodes of ~210 tokens
(3 turns) had 8,192 of 28,978 prompt tokens from the prefix cache at 128 and 20,384 at 32 (5.2 s -> 2.8 s), 64
Twenty Questions episodes of ~270 tokens 49,280 of 95,501 and 80,864 (5.9 s -> 2.8 s)."""
CPU_DEFAULT_BLOCK_SIZE = 128
"""The block size vLLM 0.32's CPU platform picks when none is given (``CpuPlatform.check_and_update_config``)."""


async def build_engine(vllm: SimpleNamespace, engine_args: dict[str, Any]) -> Any:
    """The engine, built on the engine loop (so its output handler starts there).

    On vLLM's CPU backend, chunked prefill is switched off unless ``engine_args`` say otherwise: vLLM 0.32 rewinds a
    seeded request's generator when it discards the token sampled during a partial (chunked) prefill, which CPU
    generators cannot do, and the engine dies (``RuntimeError: CPU Generator does not use offset``, in
    ``GPUModelRunner._bookkeeping_sync``) as soon as many seeded prompts exceed the step's token budget. Without
    chunking, the budget (``max_num_batched_tokens``) must hold the longest prompt, so it is raised to
    ``max_model_len`` where it is smaller. And the KV-cache block size is :data:`CPU_BLOCK_SIZE` unless
    ``engine_args`` give one (or the model needs its own, e.g. MLA), so prefix caching has blocks to reuse.
    """
    args = vllm.AsyncEngineArgs(**engine_args)
    if vllm.on_cpu and not {"enable_chunked_prefill", "block_size"} <= set(engine_args):
        resolved = args.create_engine_config()  # resolves max_model_len, the budget, the block size; args are spent
        changes: dict[str, Any] = {}
        if "enable_chunked_prefill" not in engine_args:
            budget = max(resolved.model_config.max_model_len, resolved.scheduler_config.max_num_batched_tokens)
            changes.update(enable_chunked_prefill=False, max_num_batched_tokens=budget)
        if "block_size" not in engine_args and resolved.cache_config.block_size == CPU_DEFAULT_BLOCK_SIZE:
            changes["block_size"] = CPU_BLOCK_SIZE
        args = vllm.AsyncEngineArgs(**{**engine_args, **changes})
    return vllm.AsyncLLMEngine.from_engine_args(args)


def shutdown_engine(engine: Any) -> None:
    """Shut ``engine`` down on the engine loop (a ``weakref.finalize`` callback: no reference to the agent, so it runs
    on :meth:`VLLMAgent.close`, on garbage collection and at interpreter exit)."""

    async def down() -> None:
        engine.shutdown()

    try:
        if ENGINE_LOOP.in_loop_thread() or not ENGINE_LOOP.loop().is_running():
            engine.shutdown()
        else:
            ENGINE_LOOP.call(down(), 60)
    except Exception:
        pass  # the engine's own finalizers end its processes


__all__ = [
    "CPU_BLOCK_SIZE",
    "CPU_DEFAULT_BLOCK_SIZE",
    "build_engine",
    "generation_eos",
    "import_vllm",
    "imported_vllm",
    "load_tokenizer",
    "model_files_identity",
    "shutdown_engine",
    "vllm_installed",
]
