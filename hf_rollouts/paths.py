"""Where hf_rollouts keeps what it builds: one cache root, ``$HF_ROLLOUTS_CACHE`` or ``~/.cache/hf_rollouts``.

Under it: the embedded models (:mod:`hf_rollouts.tiny_model`, :mod:`hf_rollouts.smollm2`) and the shard files of
:func:`~hf_rollouts.pipeline.generate_rollouts` (``rollouts/``). Every module takes the root from here, so setting
the variable moves all of it (the tests point it at a temporary folder).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "HF_ROLLOUTS_CACHE"


def cache_root() -> Path:
    """``$HF_ROLLOUTS_CACHE`` or ``~/.cache/hf_rollouts`` (read at each call, not at import)."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "hf_rollouts"))


def rollout_cache_dir() -> Path:
    """Default folder of :func:`~hf_rollouts.pipeline.generate_rollouts`' shard files: ``<cache root>/rollouts``."""
    return cache_root() / "rollouts"


__all__ = ["CACHE_ENV", "cache_root", "rollout_cache_dir"]
