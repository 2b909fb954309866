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
  A peft model (``build_grpo_trainer(..., peft_config=LoraConfig(...))``) is synced as TRL syncs it: the adapter
  merged into the base weights for the reload (under the base model's names, the adapter's own tensors left out),
  then unmerged (:func:`merged_tensors`). TRL 1.16's engine is built without ``enable_lora``, so what it receives
  is the full merged weights, not the adapter (our loop's ``VLLMAgent.sync_adapter`` moves the adapter alone).
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def colocated_llm(trainer: Any) -> Any:
    """The trainer's in-process ``vllm.LLM`` (colocate mode), or ``None`` in another mode."""
    generation = getattr(trainer, "vllm_generation", None)
    return getattr(generation, "llm", None) if getattr(generation, "mode", None) == "colocate" else None


@contextlib.contextmanager
def merged_tensors(model: Any) -> Iterator[dict[str, torch.Tensor]]:
    """The engine's view of ``model``'s weights, valid inside the block: its checkpoint tensors
    (:func:`~hf_rollouts.agents.vllm.weights.checkpoint_tensors`), or for a peft model its adapter merged into the
    base weights (``merge_adapter``), named as the base model names them (``.base_layer`` dropped, the adapter's
    ``lora_`` tensors left out), unmerged on exit."""
    from ...agents.vllm.weights import checkpoint_tensors

    if not hasattr(model, "merge_adapter"):
        yield checkpoint_tensors(model)
        return
    model.merge_adapter()
    try:
        base = checkpoint_tensors(model.get_base_model())
        yield {name.replace(".base_layer", ""): t for name, t in base.items() if "lora_" not in name}
    finally:
        model.unmerge_adapter()


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
        with merged_tensors(model) as weights:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
        self.llm.reset_prefix_cache()
        self.sync_seconds.append(time.perf_counter() - started)

    generation.sync_weights = types.MethodType(sync_weights, generation)


__all__ = ["colocated_llm", "merged_tensors", "reload_weights_sync"]
