"""A trained LoRA adapter into a running :class:`~.agent.VLLMAgent` engine (:func:`sync_adapter`): the base weights stay
as the engine loaded them, only the adapter moves (megabytes, not the model).

A LoRA run (``hf-rollouts train --lora-rank R --backend vllm``) builds the engine on the base model with vLLM's LoRA
support on (:func:`lora_engine_kwargs`: ``enable_lora``, ``max_lora_rank``, one adapter slot), wraps the transformers
copy in peft, and after each update calls :func:`sync_adapter` with the ``PeftModel``:

1. the adapter is written with peft's ``save_pretrained`` (``adapter_config.json`` and ``adapter_model.safetensors``,
   the adapter's tensors only) to a fresh temporary directory (``/dev/shm`` where it exists: memory, not disk);
2. a new ``vllm.lora.request.LoRARequest`` (name ``hf_rollouts-policy-vN``, id ``N``: one per policy version) is
   loaded with ``AsyncLLM.add_lora`` (vLLM 0.32's ``vllm/lora/worker_manager.py``: the adapter is read and checked
   before anything is evicted);
3. from then on every request of the agent carries it (``engine.generate(..., lora_request=...)``);
4. the previous version is removed from the engine (``remove_lora``) and its directory deleted.

The prefix cache is **not** reset: vLLM keys every cached block on the request's adapter (``("lora", name, path)``
in ``vllm/v1/core/kv_cache_utils.py``), so blocks of an older adapter are never served to the new one; they age
out of the cache as blocks do.

**Contract**: as :func:`~.weights.sync_weights`, call it between rounds (a request still running with the old
adapter after its directory is gone may fail if the engine has to reload it). The agent's fingerprint then carries
the probe of the peft-wrapped base model (``weights_probe``: what a
:class:`~hf_rollouts.agents.hf.TransformersAgent` on that model reports, adapter weights included). The adapter's
target modules must be ones vLLM serves LoRA on (the linear layers of a Llama-style model are; peft's
``all-linear`` is what the training recipe uses).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from ...aio import ENGINE_LOOP
from ..hf.agent import weights_probe
from .weights import WeightSync, scratch_dir

ADAPTER_FILE = "adapter_model.safetensors"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts (``vllm/config/lora.py``, ``MaxLoRARanks``)."""


def lora_engine_kwargs(rank: int) -> dict[str, Any]:
    """The engine arguments that let a :class:`~.agent.VLLMAgent` serve adapters of LoRA rank ``rank``:
    ``enable_lora``, ``max_lora_rank`` (the smallest of :data:`VLLM_LORA_RANKS` that holds ``rank``), one adapter
    in a batch (``max_loras=1``; the policy has one version at a time) and two in the engine's CPU cache (the new
    one is loaded before the old one is removed).

    Raises:
        ValueError: ``rank`` is not in ``1..512``.
    """
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if rank < 1 or not fits:
        raise ValueError(f"LoRA rank {rank}: vLLM serves ranks 1..{VLLM_LORA_RANKS[-1]}.")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1, "max_cpu_loras": 2}


@dataclass(frozen=True)
class AdapterSync(WeightSync):
    """What one :func:`sync_adapter` did: policy ``version`` (the ``LoRARequest``'s id), ``tensors`` adapter tensors
    of ``bytes`` bytes (the safetensors file) written in ``write_s`` seconds and loaded by the engine in ``load_s``
    (``add_lora`` plus the old version's removal); ``weights_probe`` is the agent's fingerprint's new one."""

    version: int


def sync_adapter(agent: Any, model: Any) -> AdapterSync:
    """Hand ``model``'s current adapter (a peft ``PeftModel``) to ``agent``'s engine as a new ``LoRARequest``, make
    every later request carry it, remove the previous one, and move the fingerprint (module docstring).

    Raises:
        RuntimeError: ``agent`` was closed, or its engine was built without LoRA (build it with
            ``engine_kwargs=lora_engine_kwargs(rank)``), or the engine refused the adapter.
        TypeError: ``model`` is not a peft model.
    """
    from safetensors import safe_open

    engine = getattr(agent, "_engine", None)
    if engine is None:
        raise RuntimeError("sync_adapter: the VLLMAgent was closed; build a new one.")
    if getattr(engine.vllm_config, "lora_config", None) is None:
        raise RuntimeError(
            "sync_adapter: the engine was built without LoRA; build the VLLMAgent with "
            "engine_kwargs={**lora_engine_kwargs(RANK), ...} (enable_lora=True), or sync full weights with "
            "sync_weights."
        )
    if not (hasattr(model, "peft_config") and hasattr(model, "get_base_model")):
        raise TypeError(f"sync_adapter needs a peft PeftModel (get_peft_model(...)), got {type(model).__name__}.")
    from vllm.lora.request import LoRARequest  # vLLM is imported already: the engine runs

    version = agent._lora_version + 1
    path = scratch_dir()
    try:
        started = time.perf_counter()
        model.save_pretrained(path)
        written = time.perf_counter()
        request = LoRARequest(lora_name=f"hf_rollouts-policy-v{version}", lora_int_id=version, lora_path=path)
        if not ENGINE_LOOP.call(engine.add_lora(request)):
            raise RuntimeError(f"sync_adapter: the engine did not load the adapter of version {version} ({path}).")
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    old, agent._lora_request, agent._lora_version = agent._lora_request, request, version
    agent._weights_probe = weights_probe(model.get_base_model())  # the probe a TransformersAgent on it reports
    if old is not None:
        ENGINE_LOOP.call(engine.remove_lora(old.lora_int_id))  # False when the cache had evicted it already
        shutil.rmtree(old.lora_path, ignore_errors=True)
    loaded = time.perf_counter()
    with safe_open(os.path.join(path, ADAPTER_FILE), "pt") as f:
        tensors = len(list(f.keys()))
    return AdapterSync(
        version=version,
        tensors=tensors,
        bytes=os.path.getsize(os.path.join(path, ADAPTER_FILE)),
        write_s=written - started,
        load_s=loaded - written,
        weights_probe=agent._weights_probe,
    )


def drop_adapter_files(agent: Any) -> None:
    """Remove the current adapter's directory (the agent closes: nothing will load it again)."""
    request = getattr(agent, "_lora_request", None)
    if request is not None:
        shutil.rmtree(request.lora_path, ignore_errors=True)


__all__ = ["ADAPTER_FILE", "VLLM_LORA_RANKS", "AdapterSync", "drop_adapter_files", "lora_engine_kwargs", "sync_adapter"]
