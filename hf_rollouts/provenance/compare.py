"""Field-by-field comparisons of a rollout dataset with its provenance: the rows against the recorded hashes, the
recorded agent, tokenizer and envs against the ones at hand, and stored episodes against replayed ones.

Each finding is a :class:`Mismatch` that names where (row, rollout, position), what (the field) and both values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .record import column_digest

REWARD_TOLERANCE = 1e-6
"""Rewards are recomputed by the same code on the same text: equal up to float32 rounding."""


@dataclass(frozen=True)
class Mismatch:
    """One difference between what is stored (or recorded) and what was found again."""

    field: str
    stored: Any
    found: Any
    row: int | None = None
    rollout: int | None = None
    position: int | None = None
    note: str = ""

    def line(self) -> str:
        where = ", ".join(
            f"{name} {value}"
            for name, value in (("row", self.row), ("rollout", self.rollout), ("position", self.position))
            if value is not None
        )
        text = f"{where + ': ' if where else ''}{self.field}: stored {_short(self.stored)}, found {_short(self.found)}"
        return text + (f" ({self.note})" if self.note else "")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def align_rows(recorded: list[str], current: list[str]) -> tuple[dict[int, int], list[int], list[int]]:
    """``(current row -> recorded row for rows whose hash is recorded, current rows not recorded, recorded rows not
    found)``. Equal rows (equal hashes) are matched in order."""
    where: dict[str, list[int]] = {}
    for i, h in enumerate(recorded):
        where.setdefault(h, []).append(i)
    matched, extra = {}, []
    for j, h in enumerate(current):
        if where.get(h):
            matched[j] = where[h].pop(0)
        else:
            extra.append(j)
    missing = sorted(i for rows in where.values() for i in rows)
    return matched, extra, missing


def integrity(
    provenance: dict[str, Any], rows: np.ndarray, per_column: dict[str, np.ndarray], current_hex: list[str]
) -> tuple[list[Mismatch], dict[int, int]]:
    """The rows against the recorded hashes: ``(mismatches, current row -> the row index it had in the run)``.

    With per-row hashes (``provenance.json``): an edited row (a current row whose hash is not recorded, where a
    recorded row is missing) is named with the columns whose digest changed in its shard; a dropped row and an added
    row are named. With shard digests only (a card's block): each shard whose digest differs, and its columns."""
    data = provenance.get("data") or {}
    recorded = data.get("row_hashes")
    shards = data.get("shards") or []
    out: list[Mismatch] = []
    if data.get("columns") is not None and set(per_column) != set(data["columns"]):
        gone, new = sorted(set(data["columns"]) - set(per_column)), sorted(set(per_column) - set(data["columns"]))
        out.append(Mismatch("columns", gone, new, note="columns removed (stored) and added (found)"))
    if recorded is None:
        if data.get("rows") != len(rows):
            out.append(Mismatch("rows", data.get("rows"), len(rows), note="number of task rows"))
        for shard in shards:
            a, b = shard["rows"]
            found = {n: column_digest(h[a:b]) for n, h in per_column.items()}
            changed = sorted(n for n, d in shard.get("columns", {}).items() if found.get(n) != d)
            if changed:
                out.append(Mismatch(f"shard rows [{a}, {b}) columns {changed}", "recorded digest", "other values"))
        return out, {j: j for j in range(len(rows))}
    matched, extra, missing = align_rows(recorded, current_hex)
    origin = dict(matched)
    missing_set = set(missing)
    for j in extra:  # the row before it tells which recorded row it stands in for
        guess = origin.get(j - 1, j - 1) + 1 if j else 0
        if guess in missing_set:
            missing_set.discard(guess)
            origin[j] = guess
            changed = _changed_columns(shards, guess, j, origin, per_column)
            out.append(
                Mismatch(
                    f"row hash (columns changed: {', '.join(changed) or 'unknown'})",
                    recorded[guess],
                    current_hex[j],
                    row=j,
                    note=f"row {j} was edited" + (f" (row {guess} of the run)" if guess != j else ""),
                )
            )
        else:
            out.append(Mismatch("row hash", None, current_hex[j], row=j, note="a row the provenance does not record"))
    for i in sorted(missing_set):
        out.append(Mismatch("row", recorded[i], None, row=i, note=f"row {i} of the run is missing (dropped)"))
    return out, origin


def _changed_columns(
    shards: list[dict[str, Any]], recorded_row: int, row: int, origin: dict[int, int], per_column: dict[str, Any]
) -> list[str]:
    """Columns whose digest differs in the recorded shard of ``recorded_row``, over the current rows standing for
    that shard's rows."""
    for shard in shards:
        a, b = shard["rows"]
        if a <= recorded_row < b:
            idx = sorted((i, j) for j, i in origin.items() if a <= i < b)
            if len(idx) != b - a:
                return []
            take = np.array([j for _, j in idx])
            return sorted(n for n, d in shard.get("columns", {}).items() if n in per_column and
                          column_digest(per_column[n][take]) != d)  # fmt: skip
    return []


def compare_records(
    kind: str, recorded: dict[str, Any] | None, found: dict[str, Any], keys: list[str]
) -> list[Mismatch]:
    """``recorded[k]`` against ``found[k]`` for each of ``keys`` (one level; a dict value is compared key by key)."""
    out = []
    for key in keys:
        a, b = (recorded or {}).get(key), found.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    out.append(Mismatch(f"{kind}.{key}.{sub}", a.get(sub), b.get(sub)))
        elif a != b:
            out.append(Mismatch(f"{kind}.{key}", a, b))
    return out


def _first(diff: np.ndarray) -> int | None:
    hits = np.flatnonzero(diff)
    return int(hits[0]) if len(hits) else None


def _same_float(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tol


def _compare_tokens(
    add: Any,
    what: str,
    stored: dict[str, Any],
    replayed: dict[str, Any],
    logprob_tolerance: float | None,
    rewards: bool,
) -> None:
    """One sample's per-token fields, ``stored`` against ``replayed`` (``ids``, ``mask``, ``logprobs`` (``None``:
    none), ``rewards``, unpadded lists); ``what`` prefixes the field names (``""`` for the last sample)."""
    n_s, n_r = len(stored["ids"]), len(replayed["ids"])
    n = min(n_s, n_r)
    ids_s, ids_r = np.asarray(stored["ids"][:n]), np.asarray(replayed["ids"][:n])
    mask_s, mask_r = np.asarray(stored["mask"][:n]), np.asarray(replayed["mask"][:n])
    at = _first(ids_s != ids_r)
    if at is not None:
        add(what + ("agent token" if mask_s[at] else "env token"), int(ids_s[at]), int(ids_r[at]), at)
    elif n_s != n_r:
        add(what + "length", n_s, n_r, n, note="tokens in the " + ("sample" if what else "episode"))
    at = _first(mask_s != mask_r)
    if at is not None:
        add(what + "agent mask", int(mask_s[at]), int(mask_r[at]), at)
    lp_s, lp_r = stored["logprobs"], replayed["logprobs"]
    if logprob_tolerance is not None and stored.get("has_logprobs") and replayed.get("has_logprobs"):
        if (lp_s is None) != (lp_r is None):
            add(what + "log-probs", "none" if lp_s is None else "stored", "none" if lp_r is None else "replayed")
        elif lp_s is not None:
            a, b = np.asarray(lp_s[:n], dtype=np.float64), np.asarray(lp_r[:n], dtype=np.float64)
            gap = np.where(mask_s.astype(bool) & (ids_s == ids_r), np.abs(a - b), 0.0)
            at = int(np.argmax(gap)) if len(gap) else 0
            if len(gap) and gap[at] > logprob_tolerance:
                note = f"|diff| {gap[at]:.3g} > {logprob_tolerance:g}"
                add(what + "log-prob", float(a[at]), float(b[at]), at, note=note)
    if rewards:
        rw_s = np.asarray(stored["rewards"][:n], dtype=np.float64)
        rw_r = np.asarray(replayed["rewards"][:n], dtype=np.float64)
        at = _first(np.abs(rw_s - rw_r) > REWARD_TOLERANCE)
        if at is not None:
            add(what + "per-token reward", float(rw_s[at]), float(rw_r[at]), at)


def _last_sample(columns: dict[str, Any], r: int) -> dict[str, Any]:
    n = sum(columns["padded_full_attention_mask"][r])
    lp = columns.get("padded_logprobs")
    return {
        "ids": columns["padded_full_token_ids"][r][:n],
        "mask": columns["padded_agent_token_mask"][r][:n],
        "logprobs": None if lp is None or lp[r] is None else lp[r][:n],
        "has_logprobs": lp is not None,
        "rewards": columns["padded_per_token_rewards"][r][:n],
    }


def _earlier_samples(columns: dict[str, Any], r: int) -> list[dict[str, Any]] | None:
    """The earlier samples of rollout ``r`` (``None``: the columns are not there, a dataset made before them)."""
    if columns.get("earlier_token_ids") is None:
        return None
    ids = columns["earlier_token_ids"][r] or []

    def per(name: str) -> list[Any]:
        values = columns.get(name)
        return (values[r] if values is not None and values[r] is not None else None) or [None] * len(ids)

    lp = columns.get("earlier_logprobs")
    return [
        {"ids": i, "mask": m or [], "logprobs": p, "has_logprobs": lp is not None, "rewards": w or []}
        for i, m, p, w in zip(ids, per("earlier_agent_token_mask"), per("earlier_logprobs"),
                              per("earlier_per_token_rewards"))
    ]  # fmt: skip


COUNT_FIELDS = (("num_turns", "num_turns"), ("num_samples", "num_samples"), ("sample_calls", "sample_calls"))
"""The per-rollout counts a replay must give again: agent turns, samples, and the calls each sample holds."""


def compare_episode(
    stored: dict[str, Any],
    replayed: dict[str, Any],
    row: int,
    rollout: int,
    *,
    logprob_tolerance: float | None,
    rewards: bool = True,
) -> list[Mismatch]:
    """Rollout ``rollout`` of stored row ``row`` against its replay (both rows of rollout columns): status, the
    counts (``num_turns``, ``num_samples``, ``sample_calls``), then every sample (the earlier ones of the
    ``earlier_*`` columns, each named ``earlier sample k``, and the last, the ``padded_*`` columns): length, agent and
    env tokens, the agent mask, log-probs within ``logprob_tolerance`` (``None``: not compared), per-token rewards;
    then final rewards and the verdict (``rewards=False``: no rewards compared). The first differing position of
    each field is named. A column missing on either side (a dataset made before it) is not compared."""
    out: list[Mismatch] = []

    def add(field: str, a: Any, b: Any, position: int | None = None, note: str = "") -> None:
        out.append(Mismatch(field, a, b, row=row, rollout=rollout, position=position, note=note))

    r = rollout
    if stored["statuses"][r] != replayed["statuses"][r]:
        add("status", stored["statuses"][r], replayed["statuses"][r], note=replayed["errors"][r] or "")
    for name, label in COUNT_FIELDS:
        a, b = stored.get(name), replayed.get(name)
        if a is not None and b is not None and a[r] != b[r]:
            add(label, a[r], b[r])
    early_s, early_r = _earlier_samples(stored, r), _earlier_samples(replayed, r)
    if early_s is not None and early_r is not None:
        for k, (a, b) in enumerate(zip(early_s, early_r)):
            _compare_tokens(add, f"earlier sample {k} ", a, b, logprob_tolerance, rewards)
        if len(early_s) != len(early_r):
            add("earlier samples", len(early_s), len(early_r), note="samples before the last")
    _compare_tokens(add, "", _last_sample(stored, r), _last_sample(replayed, r), logprob_tolerance, rewards)
    if not rewards:
        return out
    f_s, f_r = stored["final_rewards"][r], replayed["final_rewards"][r]
    if not _same_float(f_s, f_r, REWARD_TOLERANCE):
        add("final reward", f_s, f_r)
    if (
        stored.get("solved") is not None
        and replayed.get("solved") is not None
        and (stored["solved"][r] != replayed["solved"][r])
    ):
        add("solved", stored["solved"][r], replayed["solved"][r])
    return out


__all__ = ["REWARD_TOLERANCE", "Mismatch", "align_rows", "compare_episode", "compare_records", "integrity"]
