"""Two rollout datasets of the same tasks (before and after training) side by side: per-task reward change.

Rows are matched by their task columns (``env_class_path``, ``env_config``, ``task_data`` as stored), so the two
runs may hold the tasks in another order or only in part; the first row of a repeated task is the one matched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .api import MAX_PAGE, PAGE
from .source import TaskIndex, json_number

SORTS = ("row", "delta", "before", "after")


@dataclass
class Pairing:
    """Matched rows: ``pairs[n] = (row in A, row in B)``, plus the counts of tasks only one side has."""

    pairs: list[tuple[int, int]]
    only_a: int
    only_b: int

    @classmethod
    def build(cls, keys_a: list[str], keys_b: list[str]) -> Pairing:
        first_b: dict[str, int] = {}
        for j, key in enumerate(keys_b):
            first_b.setdefault(key, j)
        seen: set[str] = set()
        pairs = []
        for i, key in enumerate(keys_a):
            if key in first_b and key not in seen:
                pairs.append((i, first_b[key]))
                seen.add(key)
        return cls(pairs, len(keys_a) - len(pairs), len(first_b) - len(pairs))


def _record(pairing: Pairing, a: TaskIndex, b: TaskIndex, n: int) -> dict[str, Any]:
    i, j = pairing.pairs[n]
    before, after = a.mean_reward[i], b.mean_reward[j]
    return {
        "pair": n,
        "row_a": i,
        "row_b": j,
        "env": a.env[i],
        "before": json_number(before),
        "after": json_number(after),
        "delta": json_number(after - before),
        "statuses_a": a.statuses[i],
        "statuses_b": b.statuses[j],
    }


def compare(pairing: Pairing, a: TaskIndex, b: TaskIndex, params: dict[str, list[str]]) -> dict[str, Any]:
    """The comparison page: totals over every matched task and one page of per-task changes (``sort`` one of
    :data:`SORTS`, ``desc``, ``offset``, ``limit``)."""
    sort = params.get("sort", ["delta"])[0]
    if sort not in SORTS:
        raise ValueError(f"cannot sort the comparison by {sort!r}; sort by one of {SORTS}")
    desc = params.get("desc", ["0"])[0] in ("1", "true")
    offset = max(0, int(params.get("offset", ["0"])[0]))
    limit = min(MAX_PAGE, max(1, int(params.get("limit", [str(PAGE)])[0])))
    before = np.array([a.mean_reward[i] for i, _ in pairing.pairs], dtype=np.float64)
    after = np.array([b.mean_reward[j] for _, j in pairing.pairs], dtype=np.float64)
    delta = after - before
    key = {"row": np.arange(len(delta), dtype=np.float64), "delta": delta, "before": before, "after": after}[sort]
    known = [n for n in range(len(delta)) if math.isfinite(key[n])]
    order = sorted(known, key=lambda n: key[n], reverse=desc) + [n for n in range(len(delta)) if n not in set(known)]
    finite = delta[np.isfinite(delta)]
    return {
        "matched": len(pairing.pairs),
        "only_a": pairing.only_a,
        "only_b": pairing.only_b,
        "mean_before": json_number(np.nanmean(before)) if np.isfinite(before).any() else None,
        "mean_after": json_number(np.nanmean(after)) if np.isfinite(after).any() else None,
        "mean_delta": json_number(finite.mean()) if len(finite) else None,
        "improved": int((finite > 0).sum()),
        "worse": int((finite < 0).sum()),
        "same": int((finite == 0).sum()),
        "total": len(order),
        "offset": offset,
        "rows": [_record(pairing, a, b, n) for n in order[offset : offset + limit]],
    }


__all__ = ["Pairing", "SORTS", "compare"]
