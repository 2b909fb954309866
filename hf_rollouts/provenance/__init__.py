"""Provenance and verification of rollout datasets.

:func:`build_provenance` records what made a dataset and what it holds (written by
:func:`~hf_rollouts.publish.save_rollouts` as ``provenance.json`` and in the card's YAML); :func:`read_provenance`
reads it back; :func:`verify_rollouts` (``hf-rollouts verify``) checks a dataset against it and replays a seeded
sample. It reads saved datasets: it sits above the engine, beside :mod:`hf_rollouts.publish`. The names are imported
on first use (a module ``__getattr__``), so that the CLI's ``--help`` does not load the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Mismatch": "compare",
    "CARD_KEY": "record",
    "FILE": "record",
    "ProvenanceError": "record",
    "build_provenance": "record",
    "card_block": "record",
    "read_provenance": "record",
    "write_provenance": "record",
    "StoredTokensAgent": "replay",
    "LOGPROB_TOLERANCE": "verify",
    "VerifyReport": "verify",
    "verify_rollouts": "verify",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
