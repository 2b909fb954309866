"""Training only the top of a decoder: fewer trainable parameters and a shorter backward pass."""

from __future__ import annotations

import torch


def train_top_layers(model: torch.nn.Module, num_layers: int) -> list[torch.nn.Parameter]:
    """Freeze ``model`` except its top ``num_layers`` decoder layers and the final norm; return the trainable params.

    Works on transformers' decoder-only models whose base model keeps its blocks in ``.layers`` and its last norm in
    ``.norm`` (Llama, Qwen2, Mistral, SmolLM2, ...). The embeddings (and a language-model head tied to them) stay
    frozen. The backward pass then stops at the lowest trainable layer: on CPU, training the top 10 of SmolLM2's 30
    layers cuts an update's time by about half (docs/guides/training.md). Raises ``ValueError`` naming the
    model when it has no such layers or ``num_layers`` is out of range.
    """
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not hasattr(base, "norm"):
        raise ValueError(
            f"{type(model).__name__} has no decoder layers at .base_model.layers and .base_model.norm; train every "
            "parameter instead (trainable_layers 0)."
        )
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"num_layers must be in 1..{len(layers)} for {type(model).__name__}, got {num_layers}.")
    model.requires_grad_(False)
    for module in [*layers[len(layers) - num_layers :], base.norm]:
        module.requires_grad_(True)
    return [p for p in model.parameters() if p.requires_grad]
