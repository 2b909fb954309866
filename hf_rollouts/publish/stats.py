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
from datasets import Dataset

from ..schema import ROLLOUT_COLUMNS, SAMPLE_COLUMNS


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


def compute_stats(ds: Dataset) -> RolloutStats:
    """Statistics over every rollout of a rollout dataset (see module docstring for definitions)."""
    # per-rollout values and the int8 masks; token ids, rewards and log-probs (the earlier samples' too) are not read
    light = [
        c.name
        for c in ROLLOUT_COLUMNS
        if c.name in ds.column_names and c.name not in SAMPLE_COLUMNS and (not c.is_sequence or c.value.dtype == "int8")
    ]
    cols = ds.select_columns(["env_class_path", *light])
    rewards, statuses, turns, tokens, agent_tokens, verdicts, task_solved = [], [], [], [], [], [], []
    envs: Counter[str] = Counter()
    k = 0
    cut_turns = sum(map(sum, ds["num_cut_turns"])) if "num_cut_turns" in ds.column_names else 0
    samples = sum(map(sum, ds["num_samples"])) if "num_samples" in ds.column_names else None
    for row in cols:
        envs[_short_env(row["env_class_path"])] += 1
        k = max(k, len(row["final_rewards"]))
        row_verdicts = row.get("solved") or [None] * len(row["final_rewards"])  # no column: written before it existed
        for r, s, t, am, ag in zip(
            row["final_rewards"],
            row["statuses"],
            row["num_turns"],
            row["padded_full_attention_mask"],
            row["padded_agent_token_mask"],
        ):
            rewards.append(r)
            statuses.append(s)
            turns.append(t)
            tokens.append(sum(am))
            agent_tokens.append(sum(ag))
        verdicts += row_verdicts
        if any(v is not None for v in row_verdicts):
            task_solved.append(any(row_verdicts))
    tools = _tool_stats(ds)
    r = np.array([x for x in rewards if x is not None and not math.isnan(x)], dtype=np.float64)
    judged = [bool(v) for v in verdicts if v is not None]
    count = Counter(statuses)
    return RolloutStats(
        tasks=len(ds),
        rollouts_per_task=k,
        rollouts=len(rewards),
        mean_final_reward=float(r.mean()) if len(r) else math.nan,
        std_final_reward=float(r.std()) if len(r) else math.nan,
        solve_rate=float(np.mean(judged)) if judged else math.nan,
        pass_at_k=float(np.mean(task_solved)) if task_solved else math.nan,
        solved=sum(judged),
        judged=len(judged),
        mean_turns=float(np.mean(turns)) if turns else math.nan,
        cut_turns=int(cut_turns),
        mean_tokens=float(np.mean(tokens)) if tokens else math.nan,
        mean_agent_tokens=float(np.mean(agent_tokens)) if agent_tokens else math.nan,
        done=count.get("done", 0),
        truncated=count.get("truncated", 0),
        errors=count.get("error", 0),
        environments=dict(envs),
        samples=int(samples) if samples is not None else len(rewards),
        **tools,
    )


def _tool_stats(ds: Dataset) -> dict[str, Any]:
    """Tool-use counts over every rollout (empty when the dataset has no tool columns)."""
    if "num_tool_calls" not in ds.column_names:
        return {}
    calls = [n for row in ds["num_tool_calls"] for n in row]
    errors = sum(n for row in ds["num_tool_errors"] for n in row)
    records = (
        [r for row in ds["tool_calls"] for rollout in row for r in rollout] if "tool_calls" in ds.column_names else []
    )
    seconds = [r["seconds"] for r in records if r["status"] != "not_run"]
    return {
        "tool_calls": int(sum(calls)),
        "tool_errors": int(errors),
        "rollouts_with_tool_calls": sum(1 for n in calls if n),
        "tool_statuses": dict(Counter(r["status"] for r in records)),
        "mean_tool_seconds": float(np.mean(seconds)) if seconds else math.nan,
    }


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (default 95%); ``(nan, nan)`` for ``n == 0``."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
