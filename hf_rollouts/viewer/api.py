"""The viewer's JSON answers: the run, a page of the task table, a group, one rollout, and two runs compared.

Each function returns plain JSON-ready values (NaN as ``None``); :mod:`hf_rollouts.viewer.server` serves them and
:func:`hf_rollouts.viewer.server.write_html` embeds them. Statistics come from :func:`hf_rollouts.publish.compute_stats`
(the card's table) and advantages from :func:`hf_rollouts.training.group_advantages` (what GRPO trains on).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..publish.stats import compute_stats, wilson_interval
from ..schema import TASK_COLUMNS
from ..training.advantages import group_advantages
from .card import card_provenance
from .source import Opened, TaskIndex, json_number

PAGE = 50
"""Task table rows per page (a request may ask for up to :data:`MAX_PAGE`)."""
MAX_PAGE = 500
OPS = ("eq", "ne", "lt", "le", "gt", "ge", "has")
MAX_FILTERS = 20
"""The most ``where`` filters one task table request may hold (each reads every task); past it, a 400."""
MAX_FILTER_CHARS = 1000
"""The longest ``where`` filter, and the longest search text ``q``, a request may hold."""
MAX_JSON_DEPTH = 64
"""The deepest ``infos`` the API parses into JSON values; deeper (or not JSON) it is answered as its text."""
Z95 = 1.959964


def wilson(successes: int, n: int) -> list[float] | None:
    """The 95% Wilson score interval of a rate ``successes / n`` (:func:`~hf_rollouts.publish.stats.wilson_interval`)
    as JSON: ``None`` when ``n`` is 0."""
    return list(wilson_interval(successes, n)) if n > 0 else None


def _settings(settings: dict[str, Any] | None) -> dict[str, Any] | None:
    """Recorded sampling settings as written (float32 ``1.2000000476837158`` shown as ``1.2``)."""
    if settings is None:
        return None
    return {k: float(f"{v:.6g}") if isinstance(v, float) else v for k, v in settings.items()}


def _sampling(ds) -> list[dict[str, Any]]:
    """Distinct ``logprob_settings`` of the rollouts, with counts (the recorded sampling settings)."""
    if "logprob_settings" not in ds.column_names:
        return []
    counts: Counter[str] = Counter()
    for row in ds.data.column("logprob_settings").to_pylist():
        for s in row or []:
            counts[json.dumps(_settings(s), sort_keys=True)] += 1
    return [{"settings": json.loads(k), "rollouts": n} for k, n in counts.most_common()]


def histogram(values: list[float], bins: int = 20) -> dict[str, Any]:
    finite = np.array([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if not len(finite):
        return {"edges": [], "counts": []}
    lo, hi = float(finite.min()), float(finite.max())
    counts, edges = np.histogram(
        finite, bins=bins if hi > lo else 1, range=(lo, hi) if hi > lo else (lo - 0.5, lo + 0.5)
    )
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


def stats_table(opened: Opened) -> list[list[str]]:
    """The card's statistics table (:func:`~hf_rollouts.publish.compute_stats`), as ``[name, value]`` rows."""
    return [list(r) for r in compute_stats(opened.dataset).table()]


def summary(opened: Opened, index: TaskIndex, table: list[list[str]] | None) -> dict[str, Any]:
    """The run page. ``table``: :func:`stats_table`'s rows, or None while they are being computed."""
    rewards = [r for row in index.rewards for r in row]
    statuses = Counter(s for row in index.statuses for s in row)
    verdicts = [v for row in index.solved for v in row if v is not None]
    task_verdicts = [any(v for v in row if v) for row in index.solved if any(v is not None for v in row)]
    finite = [r for r in rewards if math.isfinite(r)]
    mean = float(np.mean(finite)) if finite else None
    half = Z95 * float(np.std(finite, ddof=1)) / math.sqrt(len(finite)) if len(finite) > 1 else None
    k = max((len(r) for r in index.rewards), default=0)
    return {
        "label": opened.label,
        "notes": opened.notes
        + [
            f"your column {k!r} is shown as {v!r} ({k!r} is a field of the viewer's own)"
            for k, v in index.renamed.items()
        ],
        "tasks": len(index),
        "rollouts": len(rewards),
        "k": k,
        "environments": dict(Counter(index.env)),
        "statuses": dict(statuses),
        "histogram": histogram(rewards),
        "mean_reward": mean,
        # the normal interval, kept within the rewards seen (a 0/1 reward's mean is never below 0)
        "mean_reward_interval": [max(mean - half, min(finite)), min(mean + half, max(finite))]
        if half is not None
        else None,
        "solve_rate": sum(verdicts) / len(verdicts) if verdicts else None,
        "solve_rate_interval": wilson(sum(verdicts), len(verdicts)),
        "judged": len(verdicts),
        "pass_at_k": sum(task_verdicts) / len(task_verdicts) if task_verdicts else None,
        "pass_at_k_interval": wilson(sum(task_verdicts), len(task_verdicts)),
        "judged_tasks": len(task_verdicts),
        "stats": table,
        "sampling": _sampling(opened.dataset),
        "card": card_provenance(opened.card),
        "columns": table_columns(index),
        "tokenizer": opened.tokenizer is not None,
    }


def table_columns(index: TaskIndex) -> list[str]:
    return ["row", "env", "mean_reward", "solved", "done", "truncated", "error", "turns", "length", *index.extra]


def search_rows(opened: Opened, text: str) -> set[int]:
    """Rows whose conversation text contains ``text`` (case-insensitive), read from the Arrow column one record batch
    at a time (no row is decoded)."""
    if "conversations" not in opened.dataset.column_names:
        return set()
    found: set[int] = set()
    start = 0
    for chunk in opened.dataset.data.column("conversations").chunks:
        rollouts = pc.list_flatten(chunk)
        owner = pc.take(pc.list_parent_indices(chunk), pc.list_parent_indices(rollouts))
        hits = pc.match_substring(pc.struct_field(pc.list_flatten(rollouts), "content"), text, ignore_case=True)
        found.update(start + i for i in pc.filter(owner, pc.fill_null(hits, False)).to_pylist())
        start += len(chunk)
    return found


def _matches(value: Any, op: str, target: str) -> bool:
    if value is None:
        return False
    if op == "has":
        return target.lower() in str(value).lower()
    try:
        left, right = (float(value), float(target)) if not isinstance(value, str) else (value, target)
    except ValueError:
        left, right = str(value), target
    return {
        "eq": left == right,
        "ne": left != right,
        "lt": left < right,
        "le": left <= right,
        "gt": left > right,
        "ge": left >= right,
    }[op]


@dataclass
class TaskQuery:
    """A task table request: ``sort`` a column (``desc``), keep rows with a rollout of ``status``, of ``env``,
    holding ``q`` in their conversations and passing each ``where`` (``column:op:value``, op one of :data:`OPS`)."""

    offset: int = 0
    limit: int = PAGE
    sort: str = "row"
    desc: bool = False
    status: str = ""
    env: str = ""
    q: str = ""
    where: tuple[str, ...] = ()

    @classmethod
    def parse(cls, params: dict[str, list[str]]) -> TaskQuery:
        def one(name: str, default: str = "") -> str:
            return params.get(name, [default])[0]

        where = tuple(params.get("where", []))
        if len(where) > MAX_FILTERS:
            raise ValueError(f"{len(where)} filters: a request holds at most {MAX_FILTERS} (where=column:op:value)")
        for text, what in [(w, "filter") for w in where] + [(one("q"), "search text")]:
            if len(text) > MAX_FILTER_CHARS:
                raise ValueError(f"a {what} of {len(text)} characters: at most {MAX_FILTER_CHARS} are read")
        return cls(
            offset=max(0, int(one("offset", "0"))),
            limit=min(MAX_PAGE, max(1, int(one("limit", str(PAGE))))),
            sort=one("sort", "row"),
            desc=one("desc") in ("1", "true"),
            status=one("status"),
            env=one("env"),
            q=one("q"),
            where=where,
        )


def tasks(opened: Opened, index: TaskIndex, query: TaskQuery) -> dict[str, Any]:
    """One page of the task table, filtered and sorted over every task (records built only for the page)."""
    columns = table_columns(index)
    keep = np.ones(len(index), dtype=bool)
    if query.status:
        keep &= np.array([query.status in s for s in index.statuses], dtype=bool)
    if query.env:
        keep &= np.array([e == query.env for e in index.env], dtype=bool)
    if query.q:
        hits = search_rows(opened, query.q)
        keep &= np.isin(np.arange(len(index)), list(hits)) if hits else False
    for clause in query.where:
        name, op, target = (clause.split(":", 2) + ["", ""])[:3]
        if name not in columns or op not in OPS:
            raise ValueError(f"bad filter {clause!r}: write column:op:value with a column of {columns} and op of {OPS}")
        values = _sort_values(index, name)
        keep &= np.array([_matches(v, op, target) for v in values], dtype=bool)
    rows = np.flatnonzero(keep)
    if query.sort not in columns:
        raise ValueError(f"cannot sort by {query.sort!r}; sort by one of {columns}")
    values = _sort_values(index, query.sort)
    missing = [i for i in rows if values[i] is None]  # tasks without a value go last either way
    present = sorted((i for i in rows if values[i] is not None), key=lambda i: values[i], reverse=query.desc)
    order = present + missing
    page = order[query.offset : query.offset + query.limit]
    return {
        "total": len(order),
        "offset": query.offset,
        "columns": columns,
        "rows": [index.record(int(i)) for i in page],
    }


def _sort_values(index: TaskIndex, name: str) -> list[Any]:
    if name == "row":
        return list(range(len(index)))
    if name == "env":
        return index.env
    if name == "mean_reward":
        return [json_number(v) for v in index.mean_reward]
    if name == "length":
        return [int(v) for v in index.length]
    if name == "turns":
        return [float(np.mean(t)) if t else 0.0 for t in index.turns]
    if name in ("done", "truncated", "error"):
        return [s.count(name) for s in index.statuses]
    if name == "solved":
        return [sum(bool(v) for v in s) if any(v is not None for v in s) else None for s in index.solved]
    return [v if not isinstance(v, float) or math.isfinite(v) else None for v in index.extra[name]]


def _json_or_text(text: str | None) -> Any:
    """``infos`` as its JSON value, or as its text when it is not JSON or nests deeper than :data:`MAX_JSON_DEPTH`
    (``"[" * 100000`` is shown, never a failed answer)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: deeper than the json module parses
        return text
    return value if _depth(value) <= MAX_JSON_DEPTH else text


def _depth(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _check_row(opened: Opened, row: int) -> None:
    if not 0 <= row < len(opened.dataset):
        raise IndexError(f"row {row} is out of range: the dataset has {len(opened.dataset)} rows")


def group(opened: Opened, row: int) -> dict[str, Any]:
    """Task ``row``'s group: its task columns and every rollout's reward, status, reason and GRPO advantage."""
    _check_row(opened, row)
    ds = opened.dataset
    light = [n for n in ds.column_names if n != "padded_full_token_ids" and not n.startswith("padded_")]
    item = ds.select_columns(light)[row]
    masks = ds.select_columns(["padded_agent_token_mask", "padded_full_attention_mask"])[row] if (
        "padded_agent_token_mask" in ds.column_names
    ) else None  # fmt: skip
    rewards, statuses = item["final_rewards"], item["statuses"]
    grpo = group_advantages(rewards, statuses, "grpo")
    baseline = group_advantages(rewards, statuses, "mean_baseline")
    rollouts = []
    for i, (reward, status) in enumerate(zip(rewards, statuses)):
        messages = (item.get("conversations") or [[]] * len(rewards))[i] or []
        replies = [m["content"] for m in messages if m.get("role") == "assistant" and m.get("content")]
        rollouts.append(
            {
                "rollout": i,
                "reward": json_number(reward),
                "status": status,
                "verdict": (item.get("solved") or [None] * len(rewards))[i],
                "advantage": json_number(grpo[i]),
                "advantage_mean_baseline": json_number(baseline[i]),
                "turns": (item.get("num_turns") or [None] * len(rewards))[i],
                "cut_turns": (item.get("num_cut_turns") or [None] * len(rewards))[i],
                "error": (item.get("errors") or [None] * len(rewards))[i],
                "decision": _json_or_text((item.get("infos") or [None] * len(rewards))[i]),
                "calls": (item.get("num_tool_calls") or [0] * len(rewards))[i],
                "tokens": sum(masks["padded_full_attention_mask"][i]) if masks else None,
                "agent_tokens": sum(masks["padded_agent_token_mask"][i]) if masks else None,
                "last_reply": replies[-1][:600] if replies else "",
            }
        )
    extra = {k: json_number(v) for k, v in item.items() if k not in TASK_COLUMNS and not isinstance(v, list)}
    task = {c: _shown(item.get(c)) for c in TASK_COLUMNS}  # JSON columns as their exact text (not parsed by the page)
    return {"row": row, "task": task, "extra": extra, "rollouts": rollouts}


def _shown(value: Any) -> Any:
    """A task column as the page shows it: text as stored (task rows keep exact JSON text; the page never parses
    it, so a 2**70 stays exact), a dict (a dataset written by an earlier version) as its JSON."""
    return value if value is None or isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _token_texts(opened: Opened, ids: list[int]) -> list[str] | None:
    if opened.tokenizer is None:
        return None
    return opened.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)


def rollout(opened: Opened, row: int, i: int) -> dict[str, Any]:
    """Rollout ``i`` of task ``row``: its messages, its real tokens (id, text, agent/tool flags, log-prob, reward) in
    segments of agent and environment turns, tool calls, the verifier's ``infos`` and the error or truncation."""
    _check_row(opened, row)
    item = opened.dataset[row]
    if not 0 <= i < len(item["final_rewards"]):
        raise IndexError(f"rollout {i} is out of range: row {row} has {len(item['final_rewards'])} rollouts")

    def col(name: str, default: Any = None) -> Any:
        values = item.get(name)
        return values[i] if values is not None and values[i] is not None else default

    ids = col("padded_full_token_ids", [])
    attention = col("padded_full_attention_mask", [1] * len(ids))
    agent = col("padded_agent_token_mask", [0] * len(ids))
    tool = col("padded_tool_token_mask", [0] * len(ids))
    logprobs = col("padded_logprobs")
    rewards = col("padded_per_token_rewards", [0.0] * len(ids))
    real = [j for j, a in enumerate(attention) if a]
    texts = _token_texts(opened, [ids[j] for j in real])
    segments: list[dict[str, Any]] = []
    for n, j in enumerate(real):
        token = {
            "id": ids[j],
            "text": texts[n] if texts is not None else None,
            "position": j,
            "logprob": json_number(logprobs[j]) if logprobs is not None and agent[j] else None,
            "reward": json_number(rewards[j]),
        }
        kind = "agent" if agent[j] else "tool" if tool[j] else "env"
        if not segments or segments[-1]["kind"] != kind:
            segments.append({"kind": kind, "tokens": []})
        segments[-1]["tokens"].append(token)
    return {
        "row": row,
        "rollout": i,
        "reward": json_number(col("final_rewards")),
        "status": col("statuses"),
        "verdict": col("solved"),
        "turns": col("num_turns"),
        "cut_turns": col("num_cut_turns"),
        "error": col("errors"),
        "decision": _json_or_text(col("infos")),
        "messages": col("conversations", []),
        "calls": col("tool_calls", []),
        "sampling": _settings(col("logprob_settings")),
        "has_logprobs": logprobs is not None,
        "decoded": opened.tokenizer is not None,
        "segments": segments,
        "rollouts": len(item["final_rewards"]),
    }


__all__ = [
    "MAX_FILTERS",
    "MAX_FILTER_CHARS",
    "MAX_JSON_DEPTH",
    "PAGE",
    "TaskQuery",
    "group",
    "histogram",
    "rollout",
    "search_rows",
    "stats_table",
    "summary",
    "tasks",
]
