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
"""

from __future__ import annotations

import time
import types
from typing import Any


def colocated_llm(trainer: Any) -> Any:
    """The trainer's in-process ``vllm.LLM`` (colocate mode), or ``None`` in another mode."""
    generation = getattr(trainer, "vllm_generation", None)
    return getattr(generation, "llm", None) if getattr(generation, "mode", None) == "colocate" else None


def reload_weights_sync(trainer: Any) -> None:
    """Make ``trainer.vllm_generation.sync_weights`` load the weights with vLLM's in-place reload (module
    docstring); each sync's seconds are appended to ``trainer.vllm_generation.sync_seconds``."""
    from ...agents.vllm.weights import checkpoint_tensors

    generation = trainer.vllm_generation
    if getattr(generation, "mode", None) != "colocate":
        raise ValueError("reload_weights_sync is for GRPOConfig(use_vllm=True, vllm_mode='colocate').")
    generation.sync_seconds = []

    def sync_weights(self: Any) -> None:
        started = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        weights = list(checkpoint_tensors(model).items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()
        self.sync_seconds.append(time.perf_counter() - started)

    generation.sync_weights = types.MethodType(sync_weights, generation)


__all__ = ["colocated_llm", "reload_weights_sync"]
