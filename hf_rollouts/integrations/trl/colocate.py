"""TRL's colocate mode (``GRPOConfig(use_vllm=True, vllm_mode="colocate")``): the agent turns are sampled by the
trainer's own in-process ``vllm.LLM`` (``trainer.vllm_generation.llm``).

* :class:`~.agents.VLLMColocateAgent` samples each batch of turns with ``llm.generate`` on token ids, the log-probs
  being the engine's ``processed_logprobs`` (TRL builds the ``LLM`` with that mode: ``log_softmax(logits /
  temperature)``, the quantity TRL recomputes), cut after the first stop id like the other samplers.
* :func:`reload_weights_sync` replaces TRL's weight sync where it fails. TRL 1.16's colocate sync loads each
  parameter with ``model_runner.model.load_weights([(name, param)])``; on vLLM's CPU backend (0.32) that raises
  ``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` (the CPU platform's processed weights no
  longer carry their loaders), before the first rollout. vLLM's own in-place reload
  (``collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``, in-process here: no serialization) takes
  the model's state dict, the tied ``lm_head.weight`` included
  (:func:`~hf_rollouts.agents.vllm.weights.checkpoint_tensors`; without it the reloaded output layer is left
  stale), then the prefix cache is reset as TRL does.
  :func:`~.trainer.build_grpo_trainer` applies it in colocate mode on a CPU; on a GPU TRL's own sync is kept.
  A peft model (``build_grpo_trainer(..., peft_config=LoraConfig(...))``) is synced as merged weights, as TRL
  syncs it, but computed beside the model (:func:`merged_tensors`: base weight plus the adapter's delta, under the
  base model's names) instead of TRL's in-place merge and unmerge, which moves the base weights by float rounding
  at every sync. TRL 1.16's engine is built without ``enable_lora``, so what it receives is the full merged
  weights, not the adapter (our loop's ``VLLMAgent.sync_adapter`` moves the adapter alone).
"""

from __future__ import annotations

import time
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def colocated_llm(trainer: Any) -> Any:
    """The trainer's in-process ``vllm.LLM`` (colocate mode), or ``None`` in another mode."""
    generation = getattr(trainer, "vllm_generation", None)
    return getattr(generation, "llm", None) if getattr(generation, "mode", None) == "colocate" else None


def merged_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The engine's view of ``model``'s weights: its checkpoint tensors
    (:func:`~hf_rollouts.agents.vllm.weights.checkpoint_tensors`), or for a peft model each adapted layer's base
    weight plus its adapter's delta (peft's ``get_delta_weight`` of every active adapter), named as the base model
    names them (``.base_layer`` dropped, the adapter's ``lora_`` tensors left out). Computed beside the model, never
    in it: peft's ``merge_adapter`` / ``unmerge_adapter`` (TRL's way) adds and subtracts the delta in place, which
    leaves the base weights off by float rounding after every sync."""
    import torch

    from ...agents.vllm.weights import checkpoint_tensors

    if not hasattr(model, "get_base_model"):
        return checkpoint_tensors(model)
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    tensors = checkpoint_tensors(base)
    with torch.no_grad():
        for name, module in base.named_modules():
            key = f"{name}.base_layer.weight"
            if not isinstance(module, LoraLayer) or key not in tensors:
                continue
            adapters = [a for a in module.active_adapters if a in module.lora_A]
            if adapters:
                tensors[key] = tensors[key] + sum(module.get_delta_weight(a) for a in adapters).to(tensors[key].dtype)
    return {name.replace(".base_layer", ""): t for name, t in tensors.items() if "lora_" not in name}


def reload_weights_sync(trainer: Any) -> None:
    """Make ``trainer.vllm_generation.sync_weights`` load the weights with vLLM's in-place reload (module
    docstring); each sync's seconds are appended to ``trainer.vllm_generation.sync_seconds``."""
    generation = trainer.vllm_generation
    if getattr(generation, "mode", None) != "colocate":
        raise ValueError("reload_weights_sync is for GRPOConfig(use_vllm=True, vllm_mode='colocate').")
    generation.sync_seconds = []

    def sync_weights(self: Any) -> None:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        weights = list(merged_tensors(model).items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        self.sync_seconds.append(time.perf_counter() - started)

    generation.sync_weights = types.MethodType(sync_weights, generation)


__all__ = ["colocated_llm", "merged_tensors", "reload_weights_sync"]
