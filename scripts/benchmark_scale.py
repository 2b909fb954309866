"""A rollout dataset at scale on one machine: each phase's time per episode and peak memory.

An instant agent (it answers at once with fixed token ids: no model) plays a one-turn env (the dataset env, an
``exact`` verifier; half the answers right) at each size, 4 rollouts per task. Each size runs in a process of its
own, and each phase's peak resident memory (VmRSS, sampled every 5 ms) is the highest seen during that phase:

* **generate**: ``generate_rollouts`` (the shard files written);
* **save**: ``save_rollouts`` (Arrow + parquet + ``provenance.json``: the row hashes);
* **card stats**: ``compute_stats`` (what the card and ``inspect`` print);
* **load**: ``load_from_disk`` and ``load_dataset("parquet", ...)`` of the saved folder;
* **viewer first page**: the viewer opened on the folder, then ``/api/info``, ``/api/summary`` and the first page
  of ``/api/tasks``;
* **verify --rewards-only**: ``verify_rollouts`` on a 1% sample (the row hashes of every row, the stored agent
  tokens played back through the env and its verifier).

``--compare-stats TASKS`` also times the statistics as they were computed before (:func:`rowwise_stats`, a loop over
rows in Python, kept here as the reference) against ``compute_stats`` on the same dataset of ``TASKS`` rows (the
largest size's rows repeated), checks that both give the same numbers, and prints the speed-up.

    .venv/bin/python scripts/benchmark_scale.py --episodes 10000 100000 [--compare-stats 50000] [--dir /tmp/scale]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROLLOUTS = 4


class PeakRSS:
    """The highest VmRSS of this process between :meth:`start` and :meth:`stop` (MB), sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak, self._run = 0, False

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) // 1024

    def start(self) -> PeakRSS:
        self.peak, self._run = self.now(), True
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while self._run:
            self.peak = max(self.peak, self.now())
            time.sleep(0.005)

    def stop(self) -> int:
        self._run = False
        self._thread.join()
        return max(self.peak, self.now())


def instant_agent(tokenizer: Any) -> Any:
    from hf_rollouts.agents.base import Agent
    from hf_rollouts.types import Action

    ids = tokenizer("ok", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    class Instant(Agent):
        """Answers "ok" at once with fixed ids (a token-level agent: nothing is tokenized)."""

        tokenizer = None

        def get_action(self, messages, agent_state=None):
            return Action(text="ok", token_ids=ids), agent_state

        def act_batch(self, requests):
            return [(Action(text="ok", token_ids=ids), r.agent_state) for r in requests]

        def fingerprint(self):
            return {"instant": True, "ids": ids}

    agent = Instant()
    agent.tokenizer = tokenizer
    return agent


def one_size(episodes: int, root: Path) -> dict[str, Any]:
    """Every phase at ``episodes`` episodes (``episodes / 4`` tasks): ``{phase: (seconds, peak MB)}``."""
    from datasets import Dataset, load_dataset, load_from_disk

    from hf_rollouts import generate_rollouts
    from hf_rollouts.envs.dataset import to_task_rows
    from hf_rollouts.provenance import verify_rollouts
    from hf_rollouts.publish import compute_stats, parquet_files, save_rollouts
    from hf_rollouts.tiny_model import build_tokenizer
    from hf_rollouts.viewer.server import Viewer
    from hf_rollouts.viewer.source import open_rollouts

    tokenizer = build_tokenizer()
    n = episodes // ROLLOUTS
    questions = Dataset.from_dict(
        {"prompt": [f"Say ok to {i}." for i in range(n)], "answer": ["ok" if i % 2 == 0 else "no" for i in range(n)]}
    )
    tasks = to_task_rows(questions, env_config={"verifier": "exact", "max_turns": 1})
    agent = instant_agent(tokenizer)
    out, cache = root / f"out-{episodes}", root / f"cache-{episodes}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    phases: dict[str, tuple[float, int]] = {}

    def timed(name: str, fn):
        rss = PeakRSS().start()
        t = time.perf_counter()
        value = fn()
        phases[name] = (time.perf_counter() - t, rss.stop())
        return value

    ds = timed(
        "generate",
        lambda: generate_rollouts(
            tasks, agent, ROLLOUTS, cache_dir=cache, progress=False, batch_size=64, shard_size=1024
        ),
    )
    timed("save (Arrow + parquet + provenance)", lambda: save_rollouts(ds, out))
    stats = timed("card stats", lambda: compute_stats(ds))
    timed("load (load_from_disk)", lambda: len(load_from_disk(str(out))))
    pq_cache = root / f"pq-cache-{episodes}"
    shutil.rmtree(pq_cache, ignore_errors=True)
    timed(
        "load (parquet)", lambda: len(load_dataset("parquet", data_files=parquet_files(out), cache_dir=str(pq_cache)))
    )

    def first_page():
        viewer = Viewer(open_rollouts(out, tokenizer=tokenizer))
        return [viewer.answer(p, {}) for p in ("/api/info", "/api/summary", "/api/tasks")]

    timed("viewer first page", first_page)
    report = timed(
        "verify --rewards-only (1%)",
        lambda: verify_rollouts(out, None, tokenizer=tokenizer, sample=max(1, n // 100), rewards_only=True),
    )
    assert report.exit_code == 0, report.text()
    assert stats.rollouts == episodes and stats.errors == 0 and abs(stats.mean_final_reward - 0.5) < 0.01, stats
    return {"episodes": episodes, "tasks": n, "phases": phases, "verdict": report.verdict[:60], "out": str(out)}


def rowwise_stats(ds: Any) -> Any:
    """The statistics as ``compute_stats`` computed them before it read the Arrow columns (a Python loop over rows
    and over every mask): the reference for the speed-up and for the same numbers."""
    from hf_rollouts.publish.stats import RolloutStats
    from hf_rollouts.schema import ROLLOUT_COLUMNS

    light = [
        c.name for c in ROLLOUT_COLUMNS if c.name in ds.column_names and (not c.is_sequence or c.value.dtype == "int8")
    ]
    cols = ds.select_columns(["env_class_path", *light])
    rewards, statuses, turns, tokens, agent_tokens, verdicts, task_solved = [], [], [], [], [], [], []
    envs: Counter[str] = Counter()
    k = 0
    cut_turns = sum(map(sum, ds["num_cut_turns"])) if "num_cut_turns" in ds.column_names else 0
    for row in cols:
        envs[row["env_class_path"].rsplit(".", 1)[-1]] += 1
        k = max(k, len(row["final_rewards"]))
        row_verdicts = row.get("solved") or [None] * len(row["final_rewards"])
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
    tools: dict[str, Any] = {}
    if "num_tool_calls" in ds.column_names:
        calls = [n for row in ds["num_tool_calls"] for n in row]
        records = (
            [r for row in ds["tool_calls"] for rollout in row for r in rollout]
            if "tool_calls" in ds.column_names
            else []
        )
        seconds = [r["seconds"] for r in records if r["status"] != "not_run"]
        tools = {
            "tool_calls": int(sum(calls)),
            "tool_errors": int(sum(n for row in ds["num_tool_errors"] for n in row)),
            "rollouts_with_tool_calls": sum(1 for n in calls if n),
            "tool_statuses": dict(Counter(r["status"] for r in records)),
            "mean_tool_seconds": float(np.mean(seconds)) if seconds else math.nan,
        }
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
        samples=sum(map(sum, ds["num_samples"])) if "num_samples" in ds.column_names else len(rewards),
        **tools,
    )


def same_stats(a: Any, b: Any) -> bool:
    """Field by field equal (NaN equal to NaN)."""
    x, y = a.as_dict(), b.as_dict()
    return x.keys() == y.keys() and all(
        x[k] == y[k] or (isinstance(x[k], float) and math.isnan(x[k]) and math.isnan(y[k])) for k in x
    )


def compare_stats(folder: str, tasks: int) -> dict[str, Any]:
    from datasets import concatenate_datasets, load_from_disk

    from hf_rollouts.publish import compute_stats

    base = load_from_disk(folder)
    ds = concatenate_datasets([base] * -(-tasks // len(base))).select(range(tasks)).flatten_indices()
    t = time.perf_counter()
    new = compute_stats(ds)
    t_new = time.perf_counter() - t
    t = time.perf_counter()
    old = rowwise_stats(ds)
    t_old = time.perf_counter() - t
    assert same_stats(new, old), (new, old)
    return {"tasks": tasks, "episodes": new.rollouts, "rowwise_s": t_old, "columns_s": t_new, "same": True}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--compare-stats", type=int, default=0, help="Tasks of the old-vs-new statistics run (0: none).")
    p.add_argument("--dir", default="/tmp/hf_rollouts_scale")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size in this process (the parent's child)
    p.add_argument("--stats-of", help=argparse.SUPPRESS)
    args = p.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.one:
        print(json.dumps(one_size(args.one, root)))
        return
    if args.stats_of:
        print(json.dumps(compare_stats(args.stats_of, args.compare_stats)))
        return

    def child(*extra: str) -> dict[str, Any]:
        run = subprocess.run([sys.executable, __file__, "--dir", str(root), *extra], capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"{extra} failed:\n{run.stderr[-4000:]}")
        return json.loads(run.stdout.strip().splitlines()[-1])

    print(
        f"one machine ({os.cpu_count()} CPUs, shared), instant agent, one-turn dataset env, {ROLLOUTS} rollouts a task"
    )
    print("| episodes | phase | s | µs / episode | peak RSS MB |\n|---:|---|---:|---:|---:|")
    last = None
    for episodes in args.episodes:
        result = child("--one", str(episodes))
        for phase, (seconds, peak) in result["phases"].items():
            print(f"| {episodes:,} | {phase} | {seconds:.2f} | {seconds / episodes * 1e6:.1f} | {peak} |")
        last = result
    if args.compare_stats and last is not None:
        c = child("--stats-of", last["out"], "--compare-stats", str(args.compare_stats))
        print(
            f"\nstatistics at {c['tasks']:,} tasks ({c['episodes']:,} episodes), same run, same numbers: row by row "
            f"{c['rowwise_s']:.2f} s, over the Arrow columns {c['columns_s']:.3f} s "
            f"({c['rowwise_s'] / c['columns_s']:.0f}x)"
        )


if __name__ == "__main__":
    main()
