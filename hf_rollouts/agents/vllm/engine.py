"""Building, configuring and shutting down vLLM's engine for :class:`~.agent.VLLMAgent`.

The import of vLLM and the build of its ``AsyncLLMEngine`` run on the engine loop (:mod:`hf_rollouts.aio`), where the
agent awaits every request; on vLLM's CPU backend the build adjusts two engine settings (:func:`build_engine`) and the
environment its processes start with (:func:`engine_process_env`), and :func:`warm_up_engine` plays a round's batch
shapes through it. The model's tokenizer, its ``generation_config`` eos ids and a digest of its files (the
fingerprint's) are read here too, without vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Iterator
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


TCMALLOC_NAMES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
"""tcmalloc as Debian ships it: ``libtcmalloc-minimal4`` (the allocator alone) or ``libgoogle-perftools4``."""
IOMP_NAME = "libiomp5.so"
"""Intel's OpenMP runtime: the pip wheel ``intel-openmp`` puts it in ``<venv>/lib``."""


def cpu_preload_libraries(prefixes: tuple[str, ...] | None = None) -> dict[str, str | None]:
    """The libraries vLLM's CPU installation guide asks to preload, where this machine has them:
    ``{"tcmalloc": path or None, "iomp": path or None}``.

    tcmalloc is looked for in ``<prefix>/lib`` of ``prefixes`` (default: this Python's prefix and base prefix), then
    in the dynamic linker's cache (``ldconfig -p``: Debian's ``apt-get install libtcmalloc-minimal4``); Intel
    OpenMP likewise (``pip install intel-openmp`` into the venv, or a system ``libiomp5``).
    """
    import ctypes.util
    import sys

    roots = prefixes if prefixes is not None else tuple(dict.fromkeys((sys.prefix, sys.base_prefix)))

    def find(names: tuple[str, ...], linker_name: str) -> str | None:
        for root in roots:
            for name in names:
                if os.path.isfile(os.path.join(root, "lib", name)):
                    return os.path.join(root, "lib", name)
        found = ctypes.util.find_library(linker_name)  # a bare soname from ldconfig's cache
        if found:
            for libdir in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib", "/usr/lib64"):
                if os.path.isfile(os.path.join(libdir, found)):
                    return os.path.join(libdir, found)
        return None

    return {
        "tcmalloc": find(TCMALLOC_NAMES, "tcmalloc_minimal") or find(TCMALLOC_NAMES, "tcmalloc"),
        "iomp": find((IOMP_NAME,), "iomp5"),
    }


def preload_value(current: str, libraries: dict[str, str | None]) -> str:
    """``LD_PRELOAD`` for the engine's processes: ``current`` with the found ``libraries`` in front (tcmalloc first).

    A library ``current`` already names (by kind: any ``libtcmalloc``; any OpenMP runtime for ``iomp``) is not
    added again, so a user's own choice wins. An OpenMP runtime from inside torch's package (the ``libgomp`` that
    vLLM's CPU platform appends to ``LD_PRELOAD`` in this process when it names none) is replaced by Intel's: vLLM
    refuses both at once (``OMPProcessManager``).
    """
    torch_dirs = _torch_library_dirs()
    entries = [e for e in current.replace(" ", ":").split(":") if e]
    if libraries.get("iomp"):
        entries = [e for e in entries if not ("libgomp" in e and os.path.dirname(e) in torch_dirs)]
    text = ":".join(entries)
    front = []
    if libraries.get("tcmalloc") and "libtcmalloc" not in text:
        front.append(libraries["tcmalloc"])
    if libraries.get("iomp") and not any(name in text for name in ("libiomp", "libomp", "libgomp")):
        front.append(libraries["iomp"])
    return ":".join([*front, *entries])


def _torch_library_dirs() -> set[str]:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return set()
    package = os.path.dirname(spec.origin)
    return {os.path.join(package, "lib"), os.path.join(os.path.dirname(package), "torch.libs")}


@contextlib.contextmanager
def engine_process_env(preload: bool, bind: str | None = None) -> Iterator[None]:
    """Within the block, the environment the processes the engine starts (its core and worker, started with
    ``spawn``: they inherit this process's environment) read at start: ``LD_PRELOAD`` gets the libraries
    :func:`cpu_preload_libraries` finds (:func:`preload_value`) when ``preload``, and ``VLLM_CPU_OMP_THREADS_BIND``
    is ``bind`` unless the environment sets it. On leaving, both are restored, so no later subprocess of this
    process inherits them (vLLM's CPU platform otherwise leaves torch's ``libgomp`` in ``LD_PRELOAD`` for good)."""
    saved = {key: os.environ.get(key) for key in ("LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND")}
    try:
        if preload:
            value = preload_value(saved["LD_PRELOAD"] or "", cpu_preload_libraries())
            if value:
                os.environ["LD_PRELOAD"] = value
        if bind is not None and saved["VLLM_CPU_OMP_THREADS_BIND"] is None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def build_engine(
    vllm: SimpleNamespace, engine_args: dict[str, Any], *, preload: bool = False, bind: str | None = None
) -> Any:
    """The engine, built on the engine loop (so its output handler starts there).

    On vLLM's CPU backend, chunked prefill is switched off unless ``engine_args`` say otherwise: vLLM 0.32 rewinds a
    seeded request's generator when it discards the token sampled during a partial (chunked) prefill, which CPU
    generators cannot do, and the engine dies (``RuntimeError: CPU Generator does not use offset``, in
    ``GPUModelRunner._bookkeeping_sync``) as soon as many seeded prompts exceed the step's token budget. Without
    chunking, the budget (``max_num_batched_tokens``) must hold the longest prompt, so it is raised to
    ``max_model_len`` where it is smaller. And the KV-cache block size is :data:`CPU_BLOCK_SIZE` unless
    ``engine_args`` give one (or the model needs its own, e.g. MLA), so prefix caching has blocks to reuse. The
    engine's processes start with the libraries preloaded when ``preload`` and with ``VLLM_CPU_OMP_THREADS_BIND``
    ``bind`` (:func:`engine_process_env`; both on CPU only).
    """
    with engine_process_env(preload and vllm.on_cpu, bind if vllm.on_cpu else None):
        return _build(vllm, engine_args)


def _build(vllm: SimpleNamespace, engine_args: dict[str, Any]) -> Any:
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


WARMUP_PROMPT_TOKENS = 32
"""The longest warm-up prompt (:func:`warm_up_engine`), capped at the context."""
WARMUP_NEW_TOKENS = 32
"""The most tokens a warm-up request decodes (:meth:`~.agent.VLLMAgent.warm_up`): enough steps for the decode batch
to shrink from a round's size to one."""


def warmup_prompts(requests: int, longest: int, vocab_size: int) -> list[list[int]]:
    """``requests`` prompts of fixed pseudo-random ids, of lengths spread evenly from 1 to ``longest``."""
    return [
        [(1 + 7919 * i + 104729 * j) % vocab_size for j in range(1 + i * (longest - 1) // max(requests - 1, 1))]
        for i in range(requests)
    ]


async def warm_up_engine(vllm: SimpleNamespace, engine: Any, *, requests: int, max_tokens: int) -> None:
    """Play ``requests`` requests through ``engine`` at once and drop the prefix cache they filled.

    The prompts (:func:`warmup_prompts`, up to :data:`WARMUP_PROMPT_TOKENS` ids) are prefilled together, then
    request ``i`` decodes ``1 + i * max_tokens // requests`` tokens, ignoring stop ids, so the decode batch shrinks
    from ``requests`` to one: the engine's first steps at the batch shapes of a round are paid here.
    """
    config = engine.vllm_config
    vocab = int(config.model_config.get_vocab_size())
    longest = max(1, min(WARMUP_PROMPT_TOKENS, int(config.model_config.max_model_len) - max_tokens - 1))

    async def one(i: int, prompt: list[int]) -> None:
        params = vllm.SamplingParams(
            temperature=1.0, seed=i, max_tokens=1 + i * max_tokens // requests, ignore_eos=True, logprobs=0,
            detokenize=False, output_kind=vllm.FINAL_ONLY,
        )  # fmt: skip
        async for _ in engine.generate(vllm.TokensPrompt(prompt_token_ids=prompt), params, request_id=f"warmup-{i}"):
            pass

    await asyncio.gather(*(one(i, p) for i, p in enumerate(warmup_prompts(requests, longest, vocab))))
    await engine.reset_prefix_cache()


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
    "WARMUP_NEW_TOKENS",
    "WARMUP_PROMPT_TOKENS",
    "build_engine",
    "cpu_preload_libraries",
    "engine_process_env",
    "generation_eos",
    "import_vllm",
    "imported_vllm",
    "load_tokenizer",
    "model_files_identity",
    "preload_value",
    "shutdown_engine",
    "vllm_installed",
    "warm_up_engine",
    "warmup_prompts",
]
