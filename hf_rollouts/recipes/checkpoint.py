"""A training run's checkpoints, written atomically and checked when read back (``--checkpoint-every``,
``--resume``).

A checkpoint is a folder ``OUTPUT_DIR/checkpoints/round-NNNN`` holding everything the next round depends on: the
weights (``model.safetensors``) or, for a LoRA run, the adapter alone (``adapter/``, as peft's ``save_pretrained``
writes it), the optimizer's state (``optimizer.pt``), the torch / numpy / Python RNG states (``rng.json``) and the
run's state (``state.json``: the round index, the data position, the metrics so far, the held-out base rate, the
config). It is written in a temporary sibling folder, every file and the folder fsynced, ``manifest.json`` (each
file's size and sha256) written last, then renamed into place and the parent fsynced: a run killed at any point
leaves either a complete checkpoint or a temporary folder that is never read (and removed by the next save).

:func:`latest_checkpoint` takes the newest folder whose manifest matches its files; a torn one (a file missing or
changed, no manifest) is skipped with a warning naming what is wrong, and the one before it is used.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "round-"
MANIFEST = "manifest.json"


class TornCheckpointWarning(UserWarning):
    """A checkpoint folder whose files do not match its manifest (a run killed while writing it, or a file removed
    afterwards): it is skipped."""


@dataclass
class Checkpoint:
    """A complete checkpoint folder and its ``state.json``."""

    path: Path
    state: dict[str, Any]

    @property
    def round(self) -> int:
        return int(self.state["round"])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    """The torch (CPU, and CUDA where there is one), numpy and Python RNG states, as JSON."""
    import numpy as np
    import torch

    def encode(t: Any) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode()

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": encode(torch.get_rng_state()), "python": list(random.getstate()),
             "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = [encode(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    import numpy as np
    import torch

    def decode(text: str) -> Any:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(decode(state["torch"]))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([decode(s) for s in state["cuda"]])


def save_checkpoint(root: str | Path, round_index: int, write: Callable[[Path], None], state: dict[str, Any],
                    keep: int = 2) -> Path:  # fmt: skip
    """Write ``root/round-NNNN`` atomically: ``write(folder)`` puts the weights and optimizer files in a temporary
    folder, then ``state.json`` (``state`` with ``round``), ``rng.json`` and the manifest go beside them, everything
    is fsynced and the folder renamed into place. Leftover temporary folders of a killed run are removed first; of
    the complete checkpoints the newest ``keep`` stay. Returns the checkpoint's path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(f".{PREFIX}*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    final, tmp = root / f"{PREFIX}{round_index:04d}", root / f".{PREFIX}{round_index:04d}.tmp"
    tmp.mkdir()
    write(tmp)
    (tmp / "state.json").write_text(json.dumps({**state, "round": round_index}, indent=1))
    (tmp / "rng.json").write_text(json.dumps(rng_state()))
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for p in files:
        _fsync(p)
    manifest = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(tmp / MANIFEST)
    for folder in sorted({p.parent for p in files} | {tmp}, key=lambda p: -len(p.parts)):
        _fsync(folder)
    if final.exists():  # the same round written again (a resumed run that re-did it): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(root)
    complete = [c for c in _folders(root) if (c / MANIFEST).is_file()]
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _folders(root: Path) -> list[Path]:
    """``round-NNNN`` folders, oldest first."""
    found = [p for p in root.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX) :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with checkpoint folder ``path`` (``None``: it matches its manifest)."""
    if not (path / MANIFEST).is_file():
        return "it has no manifest.json (the run was killed while writing it?)"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except json.JSONDecodeError as exc:
        return f"its manifest.json does not parse ({exc})"
    for name, entry in manifest.items():
        p = path / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != entry["bytes"] or _sha256(p) != entry["sha256"]:
            return f"{name} does not match its manifest (size or sha256)"
    return None


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``root`` (``None``: none), skipping torn ones with a
    :class:`TornCheckpointWarning` that names the folder and what is wrong with it."""
    for path in reversed(_folders(Path(root))):
        problem = checkpoint_problem(path)
        if problem is None:
            return Checkpoint(path, json.loads((path / "state.json").read_text()))
        warnings.warn(f"checkpoint {path} is torn: {problem}; using the one before it.", TornCheckpointWarning,
                      stacklevel=2)  # fmt: skip
    return None


def save_weights(folder: Path, model: Any, optimizer: Any, adapter: bool) -> None:
    """The trained state into ``folder``: the LoRA adapter (peft's ``save_pretrained`` of ``model``, a
    ``PeftModel``) or every weight (safetensors' ``save_model``: tied weights once), and the optimizer's state."""
    import torch

    if adapter:
        model.save_pretrained(str(folder / "adapter"))
    else:
        from safetensors.torch import save_model

        save_model(model, str(folder / "model.safetensors"))
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")


def load_weights(checkpoint: Checkpoint, model: Any, optimizer: Any, adapter: bool) -> None:
    """Load what :func:`save_weights` wrote into ``model`` (the adapter's weights into the ``PeftModel``, or every
    weight, strictly) and ``optimizer``, and restore the RNG states."""
    import torch

    path = checkpoint.path
    if adapter:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(model, load_file(str(path / "adapter" / "adapter_model.safetensors")))
        if result.unexpected_keys:
            raise ValueError(f"{path}: the adapter has weights the model does not: {result.unexpected_keys[:3]}")
    else:
        from safetensors.torch import load_model

        load_model(model, str(path / "model.safetensors"), strict=True)
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    set_rng_state(json.loads((path / "rng.json").read_text()))


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


__all__ = ["Checkpoint", "TornCheckpointWarning", "checkpoint_problem", "folder_bytes", "latest_checkpoint",
           "load_weights", "rng_state", "save_checkpoint", "save_weights", "set_rng_state"]  # fmt: skip
