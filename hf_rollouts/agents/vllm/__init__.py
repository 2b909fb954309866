"""vLLM's engine in-process as an agent (:class:`VLLMAgent`); vLLM itself is imported only when one is built.

vLLM lives in a venv of its own (it pins torch and transformers): ``bash scripts/setup_vllm.sh`` builds it on
Linux CPUs; see docs/guides/agents.md (vLLM) for GPUs.
"""

from .adapters import AdapterSync, lora_engine_kwargs, sync_adapter
from .agent import STAT_KEYS, VLLMAgent, VLLMRequestError
from .engine import import_vllm, model_files_identity, vllm_installed
from .settings import SPEC_PREFIX, VLLMSettings, VLLMUnavailableError, logprob_convention, parse_vllm_spec
from .weights import WeightSync, sync_weights

__all__ = [
    "SPEC_PREFIX",
    "AdapterSync",
    "STAT_KEYS",
    "VLLMAgent",
    "VLLMRequestError",
    "VLLMSettings",
    "VLLMUnavailableError",
    "WeightSync",
    "import_vllm",
    "logprob_convention",
    "lora_engine_kwargs",
    "model_files_identity",
    "parse_vllm_spec",
    "sync_adapter",
    "sync_weights",
    "vllm_installed",
]
