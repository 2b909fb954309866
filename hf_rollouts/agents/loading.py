"""Build an agent from a model spec string, as the CLI and scripts spell it.

* ``tiny`` / ``tiny-small`` — the embedded model (:func:`hf_rollouts.models.build_tiny_model`),
  built offline; ``tiny`` for tests and demos, ``tiny-small`` (4 layers, 256 wide) for benchmarks.
* anything else — a hub id or local path, loaded with ``from_pretrained``.
"""

from __future__ import annotations

from typing import Any

from .hf import SamplingConfig, TransformersAgent

TINY_SPECS = {"tiny": "tiny", "tiny-small": "small"}


def load_agent(spec: str, sampling: SamplingConfig | None = None, *, model_seed: int = 0, **kwargs: Any) -> TransformersAgent:
    """Return a :class:`TransformersAgent` for ``spec`` (see module docstring)."""
    sampling = sampling or SamplingConfig()
    if spec in TINY_SPECS:
        from ..models import build_tiny_model

        model, tokenizer = build_tiny_model(seed=model_seed, size=TINY_SPECS[spec])
        return TransformersAgent(model, tokenizer, sampling, name=model.config._name_or_path, **kwargs)
    return TransformersAgent.from_pretrained(spec, sampling=sampling, **kwargs)
