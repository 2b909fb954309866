"""Summary statistics of a rollout dataset, for dataset cards and ``hf-rollouts inspect``.

A rollout is *solved* when its ``solved`` column says so: the env's own ``info["solved"]``, else its final reward
reached the env's declared ``max_reward`` (:func:`hf_rollouts.rollout.group.settle_solved`). A rollout whose env
declares neither has no verdict (``solved`` null): it is left out of the solve rate and pass@k, which are NaN when
no rollout has one. Error rollouts (NaN reward) are left out of reward means and counted apart; they are never
solved.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset


@dataclass
class RolloutStats:
    tasks: int
    rollouts_per_task: int
    rollouts: int
    mean_final_reward: float
    std_final_reward: float
    solve_rate: float
    pass_at_k: float
    solved: int
    """Rollouts solved."""
    judged: int
    """Rollouts with a verdict (``solved`` not null): the solve rate's denominator."""
    mean_turns: float
    cut_turns: int
    mean_tokens: float
    mean_agent_tokens: float
    done: int
    truncated: int
    errors: int
    environments: dict[str, int]
    tool_calls: int = 0
    tool_errors: int = 0
    rollouts_with_tool_calls: int = 0
    tool_statuses: dict[str, int] | None = None
    mean_tool_seconds: float = math.nan
    samples: int = 0
    """Stored token sequences over every rollout (the ``num_samples`` column; one per rollout when absent)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> list[tuple[str, str]]:
        k = self.rollouts_per_task
        return (
            [
                ("tasks", f"{self.tasks}"),
                ("rollouts", f"{self.rollouts} ({k} per task)"),
                (
                    "mean final reward",
                    f"{self.mean_final_reward:.4f} ± {self.std_final_reward:.4f} (std, errors excluded)",
                ),
                ("solve rate (pass@1)", self._solve_rate()),
                (f"pass@{k}", "n/a" if math.isnan(self.pass_at_k) else f"{self.pass_at_k:.4f}"),
                ("turns per episode", f"{self.mean_turns:.2f}"),
                ("turns cut by the token budget", f"{self.cut_turns}"),
                ("tokens per episode", f"{self.mean_tokens:.1f} ({self.mean_agent_tokens:.1f} sampled by the agent)"),
                ("status counts", f"done {self.done}, truncated {self.truncated}, error {self.errors}"),
            ]
            + self._sample_rows()
            + self._tool_rows()
        )

    def _sample_rows(self) -> list[tuple[str, str]]:
        if self.samples <= self.rollouts:
            return []
        branches = self.samples - self.rollouts
        return [("samples", f"{self.samples} ({branches} branches; tokens per episode count each one's last sample)")]

    def _solve_rate(self) -> str:
        if not self.judged:
            return "n/a (no rollout's env says what solved is: set env_config['max_reward'] or info['solved'])"
        rate = f"{self.solve_rate:.4f} ({self.solved} of {self.judged} rollouts"
        left_out = self.rollouts - self.judged
        return rate + (f"; {left_out} of envs that declare no max_reward left out)" if left_out else ")")

    def _tool_rows(self) -> list[tuple[str, str]]:
        if not self.tool_calls:
            return []
        statuses = ", ".join(f"{k} {v}" for k, v in sorted((self.tool_statuses or {}).items()))
        return [
            (
                "tool calls",
                f"{self.tool_calls} ({self.tool_calls / max(self.rollouts, 1):.2f} per episode; "
                f"{self.rollouts_with_tool_calls} episodes called a tool)",
            ),
            ("tool errors", f"{self.tool_errors} ({self.tool_errors / self.tool_calls:.1%} of calls)"),
            ("tool call statuses", statuses),
            ("seconds per tool call", f"{self.mean_tool_seconds:.4f} (mean)"),
        ]


def _short_env(path: str) -> str:
    return path.rsplit(".", 1)[-1]


def _column(table: Dataset, name: str) -> pa.Array:
    """Column ``name`` of the dataset (its indices mapping applied, if any) as one Arrow array; only that column is
    read."""
    column = table[name]
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _values(arr: pa.Array, depth: int = 1) -> pa.Array:
    """The values of a list array ``depth`` levels down (the slices and null lists respected)."""
    for _ in range(depth):
        arr = arr.flatten()
    return arr


def _mask_total(table: Dataset, name: str) -> int:
    """The sum of an int8 mask column over every rollout (a ``[rollout][token]`` column): one NumPy sum of its
    values, never a Python loop over rows."""
    values = _values(_column(table, name), 2).to_numpy(zero_copy_only=False)
    return int(values.sum(dtype=np.int64))


def compute_stats(ds: Dataset) -> RolloutStats:
    """Statistics over every rollout of a rollout dataset (see module docstring for definitions).

    Computed over the Arrow columns with NumPy and pyarrow's compute kernels: the masks are summed as flat arrays,
    never walked row by row (``scripts/benchmark_scale.py`` measures it). Token ids, rewards and log-probs are not
    read."""
    table = ds.with_format("arrow")  # each column read once, as Arrow
    final = _column(table, "final_rewards")
    per_task = pc.list_value_length(final).fill_null(0).to_numpy(zero_copy_only=False)
    k = int(per_task.max()) if len(per_task) else 0
    rewards = _values(final).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls: NaN
    r = rewards[~np.isnan(rewards)]
    rollouts = len(rewards)
    statuses = pc.value_counts(_values(_column(table, "statuses"))).to_pylist()
    count = {s["values"]: s["counts"] for s in statuses}
    turns = _values(_column(table, "num_turns")).to_numpy(zero_copy_only=False)
    cut_turns = (
        int(pc.sum(_values(_column(table, "num_cut_turns"))).as_py() or 0)
        if "num_cut_turns" in table.column_names
        else 0
    )
    judged_count, solved_count, pass_at_k = 0, 0, math.nan
    if "solved" in ds.column_names:
        solved = _column(table, "solved")
        verdicts = _values(solved)
        valid = verdicts.is_valid().to_numpy(zero_copy_only=False)
        hits = verdicts.fill_null(False).to_numpy(zero_copy_only=False)
        judged_count, solved_count = int(valid.sum()), int(hits.sum())
        lengths = pc.list_value_length(solved).fill_null(0).to_numpy(zero_copy_only=False)
        rows = np.repeat(np.arange(len(lengths)), lengths)
        judged_rows = np.bincount(rows, weights=valid, minlength=len(lengths)) > 0
        solved_rows = np.bincount(rows, weights=hits, minlength=len(lengths)) > 0
        if judged_rows.any():
            pass_at_k = float(np.mean(solved_rows[judged_rows]))
    samples = None  # a dataset written before the samples columns: one sample per rollout
    if "num_samples" in table.column_names:
        samples = int(pc.sum(_values(_column(table, "num_samples"))).as_py() or 0)
    envs = pc.value_counts(_column(table, "env_class_path")).to_pylist()
    environments: Counter[str] = Counter()
    for e in envs:
        environments[_short_env(e["values"])] += e["counts"]
    return RolloutStats(
        tasks=len(ds),
        rollouts_per_task=k,
        rollouts=rollouts,
        mean_final_reward=float(r.mean()) if len(r) else math.nan,
        std_final_reward=float(r.std()) if len(r) else math.nan,
        solve_rate=solved_count / judged_count if judged_count else math.nan,
        pass_at_k=pass_at_k,
        solved=solved_count,
        judged=judged_count,
        mean_turns=float(np.mean(turns)) if len(turns) else math.nan,
        cut_turns=cut_turns,
        mean_tokens=_mask_total(table, "padded_full_attention_mask") / rollouts if rollouts else math.nan,
        mean_agent_tokens=_mask_total(table, "padded_agent_token_mask") / rollouts if rollouts else math.nan,
        done=count.get("done", 0),
        truncated=count.get("truncated", 0),
        errors=count.get("error", 0),
        environments=dict(environments),
        samples=samples if samples is not None else rollouts,
        **_tool_stats(ds),
    )


def _tool_stats(ds: Dataset) -> dict[str, Any]:
    """Tool-use counts over every rollout (empty when the dataset has no tool columns)."""
    if "num_tool_calls" not in ds.column_names:
        return {}
    table = ds.with_format("arrow")
    calls = _values(_column(table, "num_tool_calls")).fill_null(0).to_numpy(zero_copy_only=False)
    errors = int(pc.sum(_values(_column(table, "num_tool_errors"))).as_py() or 0)
    statuses: dict[str, int] = {}
    seconds = np.array([], dtype=np.float64)
    if "tool_calls" in ds.column_names:
        records = _values(_column(table, "tool_calls"), 2)  # one struct per call
        status = pc.struct_field(records, "status")
        statuses = {s["values"]: s["counts"] for s in pc.value_counts(status).to_pylist()}
        run = pc.not_equal(status, "not_run")
        secs = pc.struct_field(records, "seconds")
        seconds = pc.filter(secs, run).to_numpy(zero_copy_only=False).astype(np.float64)
    return {
        "tool_calls": int(calls.sum()),
        "tool_errors": errors,
        "rollouts_with_tool_calls": int((calls != 0).sum()),
        "tool_statuses": statuses,
        "mean_tool_seconds": float(np.mean(seconds)) if len(seconds) else math.nan,
    }


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (default 95%); ``(nan, nan)`` for ``n == 0``."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
