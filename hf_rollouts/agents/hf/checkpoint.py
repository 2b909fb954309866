"""A :class:`~.agent.TransformersAgent`'s fingerprint read from its checkpoint's files, without loading the model.

A run's cache key holds the agent's :meth:`~.agent.TransformersAgent.fingerprint` (model name, parameter count,
weights probe, sampling settings). A Ray driver that only hands a recipe to its workers need not hold the model to
compute it: the parameter names, shapes and count come from the model class built on PyTorch's ``meta`` device
(no memory), and the probed values (:func:`~.agent.probe_stride`: 256 per tensor) are read from the safetensors
files, row by row, as the loader would cast them. The result equals the loaded agent's fingerprint, so the cache key
(and its files) are those of a run that loaded the model.

When that cannot be known for sure the answer is ``None`` (then the caller loads the model): weights that are not
safetensors, a parameter the checkpoint does not hold under the model's own name (transformers would rename,
convert or initialise it on load), a quantized checkpoint, modules kept in float32 while the rest is cast.
Whoever builds the agent from the recipe later checks that its fingerprint is this one (see
:mod:`hf_rollouts.shard_task`), so a mistake here stops the run; it never mixes samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..sampling import SamplingConfig
from .agent import PROBE_SIZE, TransformersAgent, probe_digest, probe_stride
from .kv_cache import kv_reuse_unsafe_reason

WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"


def checkpoint_fingerprint(
    folder: str | Path,
    *,
    name: str,
    sampling: SamplingConfig,
    seed: int,
    reuse_kv: bool,
    backend: str,
    cache: str = "auto",
    dtype: torch.dtype | str = "auto",
    trust_remote_code: bool = False,
) -> dict[str, Any] | None:
    """The fingerprint of ``TransformersAgent(model loaded from folder with dtype, ..., name=name)``, or ``None``
    when it cannot be read from the files (see the module docstring)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    files = _weight_files(folder)
    if files is None:
        return None
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        if getattr(config, "quantization_config", None) is not None:
            return None
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # a model class that cannot be built from its config alone: load it instead
        return None
    if getattr(model, "_keep_in_fp32_modules", None) or getattr(model, "_keep_in_fp32_modules_strict", None):
        return None
    target = _load_dtype(dtype, config)
    samples = []
    handles: dict[Path, Any] = {}
    try:
        for param_name, param in model.named_parameters():
            path = files.get(param_name)
            if path is None:
                return None
            if path not in handles:
                handles[path] = safe_open(str(path), framework="pt")
            values = handles[path].get_slice(param_name)
            if tuple(values.get_shape()) != tuple(param.shape):
                return None
            sample = _probed_values(values, tuple(param.shape))
            samples.append((param_name, sample if target is None else sample.to(target)))
    finally:
        handles.clear()
    return TransformersAgent.fingerprint_of(
        name,
        sum(p.numel() for p in model.parameters()),
        probe_digest(samples),
        sampling,
        seed,
        reuse_kv and cache != "static" and kv_reuse_unsafe_reason(model) is None,  # as TransformersAgent decides
        backend,
        cache,
    )


def _weight_files(folder: Path) -> dict[str, Path] | None:
    """Tensor name -> the safetensors file holding it, or ``None`` for a folder without safetensors weights."""
    if (folder / WEIGHTS_INDEX).is_file():
        index = json.loads((folder / WEIGHTS_INDEX).read_text())
        return {name: folder / file for name, file in index.get("weight_map", {}).items()}
    if (folder / WEIGHTS_FILE).is_file():
        from safetensors import safe_open

        with safe_open(str(folder / WEIGHTS_FILE), framework="pt") as f:
            return dict.fromkeys(f.keys(), folder / WEIGHTS_FILE)
    return None


def _load_dtype(dtype: torch.dtype | str, config: Any) -> torch.dtype | None:
    """The dtype ``from_pretrained(dtype=dtype)`` gives the parameters: ``dtype`` itself, or with ``"auto"`` the
    config's (``None``: the checkpoint's own, no cast)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(found, str):
        found = getattr(torch, found, None)
    return found if isinstance(found, torch.dtype) else None


def _probed_values(values: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """The values :meth:`~.agent.TransformersAgent.weights_probe` samples from a tensor of ``shape``, reading only
    the rows (first-dimension slices) that hold them."""
    numel = 1
    for size in shape:
        numel *= size
    indices = range(0, numel, probe_stride(numel))[:PROBE_SIZE]
    if len(shape) <= 1:
        return values[:].reshape(-1)[list(indices)]
    row = numel // shape[0]
    rows: dict[int, torch.Tensor] = {}
    out = []
    for i in indices:
        r = i // row
        if r not in rows:
            rows[r] = values[r : r + 1].reshape(-1)
        out.append(rows[r][i % row])
    return torch.stack(out)


__all__ = ["checkpoint_fingerprint"]
