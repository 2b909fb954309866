"""One rule for deriving seeds: a stable hash of the parts that identify what is seeded."""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """A 32-bit seed from ``parts`` (joined with ``":"``), stable across processes and Python versions.

    Unlike ``hash()``, it does not change with ``PYTHONHASHSEED``, so a run's seeds are the
    same in every process of ``accelerate launch`` and in a rerun.
    """
    key = ":".join(map(str, parts))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
