"""Row hashes of a rollout dataset, computed over its Arrow columns with NumPy (no Python loop over rows).

A row's hash is a 64-bit digest of every value it stores (task columns and rollout columns, nested lists, strings,
nulls, NaNs): each leaf value is mixed with its position in the row, its place in the column's nesting and the
column's name (splitmix64's finaliser), the row's mixed values are summed (mod 2**64) per column, and the columns'
sums are mixed together (:func:`hf_rollouts.provenance.record.data_hashes`). It is a checksum that catches an
edited, dropped, added or reordered row (an accidental change flips it with probability ``1 - 2**-64``), not a
signature: whoever edits the data can edit the recorded hashes too (see the reproducibility guide, "Check a rollout
dataset"). Shard digests are the sha256 of their rows' hashes.

Cost: one pass over each column's buffers, about as fast as reading them (``scripts/benchmark_scale.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_U64 = np.uint64
_M1, _M2, _GOLDEN = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB), _U64(0x9E3779B97F4A7C15)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _U64(30))) * _M1
        x = (x ^ (x >> _U64(27))) * _M2
        return x ^ (x >> _U64(31))


def salt(*parts: object) -> np.uint64:
    """A 64-bit constant for a column and a leaf of its nesting."""
    return _U64(int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little"))


def _bits(arr: pa.Array) -> np.ndarray:
    """The values of a primitive array as uint64 bit patterns (nulls: 0; their validity is a leaf of its own)."""
    if pa.types.is_boolean(arr.type):
        return arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64)
    values = arr.to_numpy(zero_copy_only=False) if arr.null_count == 0 else arr.fill_null(0).to_numpy()
    if values.dtype.kind == "f":
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[values.dtype.itemsize]
        return values.view(width).astype(np.uint64)
    return values.astype(np.int64).view(np.uint64)


def _leaves(arr: pa.Array, rows: np.ndarray) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """``(leaf name, uint64 values, row of each value)`` for every leaf of ``arr`` (one array of a column, rows
    ``rows``): list lengths and validity are leaves too, so the nesting is hashed, not only the values."""
    if arr.null_count:
        yield "valid", arr.is_valid().to_numpy(zero_copy_only=False).astype(np.uint64), rows
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy().astype(np.int64)
        yield "len", lengths.view(np.uint64), rows
        yield from ((f"[{name}", v, r) for name, v, r in _leaves(arr.flatten(), np.repeat(rows, lengths)))
    elif pa.types.is_struct(arr.type):
        for i, child in enumerate(arr.flatten()):
            name = arr.type.field(i).name
            yield from ((f".{name}{leaf}", v, r) for leaf, v, r in _leaves(child, rows))
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type) or pa.types.is_large_string(arr.type):
        arr = pc.cast(arr, pa.large_binary()).fill_null(b"")
        lengths = pc.binary_length(arr).to_numpy().astype(np.int64)
        yield "len", lengths.view(np.uint64), rows
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
        data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]] if len(arr) else []
        yield "bytes", np.asarray(data, dtype=np.uint64), np.repeat(rows, lengths)
    else:
        yield "", _bits(arr), rows


def _positions(rows: np.ndarray) -> np.ndarray:
    """Each value's index among its row's values of the same leaf (``rows`` is sorted)."""
    if not len(rows):
        return rows.astype(np.uint64)
    starts = np.searchsorted(rows, rows, side="left")
    return (np.arange(len(rows)) - starts).astype(np.uint64)


def column_hashes(column: pa.ChunkedArray | pa.Array, name: str) -> np.ndarray:
    """One uint64 per row: the digest of the row's value in column ``name``."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    out = np.zeros(len(arr), dtype=np.uint64)
    for leaf, values, rows in _leaves(arr, np.arange(len(arr), dtype=np.int64)):
        if not len(values):
            continue
        with np.errstate(over="ignore"):
            mixed = mix(values ^ mix(_positions(rows) * _GOLDEN + salt(name, leaf)))
        np.add.at(out, rows, mixed) if len(values) < 64 else _add_sorted(out, rows, mixed)
    return out


def _add_sorted(out: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """``out[rows] += values`` (wrapping) for sorted ``rows``, by ``np.add.reduceat`` over each row's run."""
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    with np.errstate(over="ignore"):
        out[rows[starts]] += np.add.reduceat(values, starts)


def digest(hashes: np.ndarray) -> str:
    """The sha256 (hex) of a run of row hashes: a shard's or a column's digest."""
    return hashlib.sha256(np.ascontiguousarray(hashes, dtype="<u8").tobytes()).hexdigest()


def to_hex(hashes: np.ndarray) -> list[str]:
    return [f"{int(h):016x}" for h in hashes]


__all__ = ["column_hashes", "digest", "mix", "salt", "to_hex"]
