"""The process state every part of hf_rollouts shares (accelerate's ``PartialState``).

``PartialState()`` alone only forms a multi-process group on an accelerator; on a
CPU-only machine, processes started by ``torchrun`` / ``accelerate launch`` would
each believe they are alone and all do the whole job. :func:`process_state` asks
for CPU mode when no accelerator is present (or ``ACCELERATE_USE_CPU=1``), so
multi-CPU runs shard the work too (gloo backend). ``PartialState`` is a
singleton: whichever call comes first decides, so hf_rollouts always goes
through here.
"""

from __future__ import annotations

import torch
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env


def _has_accelerator() -> bool:
    if torch.cuda.is_available():
        return True
    for name in ("mps", "xpu", "npu", "mlu"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            return True
    return False


def process_state() -> PartialState:
    """accelerate's shared state: device, process index and count, barriers."""
    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU") or not _has_accelerator())
