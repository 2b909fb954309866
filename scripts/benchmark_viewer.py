"""How the viewer scales: first-page time and the server's memory at 1k, 10k and 50k task rows (docs/speed.md).

Writes synthetic rollout datasets with the real schema (hf_rollouts.schema's task and rollout features, plus a user
column), 4 rollouts per task of 64-192 tokens, then for each starts `hf-rollouts view DIR` as its own process and
measures: the time from the process start to the printed address (imports, the dataset opened, the task index
built), the first page (the page, its script, /api/info, /api/summary and the first page of the task table), a
sorted and a searched page, a group and a rollout; the server's resident memory (VmRSS) after each, beside a process
that only imported the package; and when the card's statistics (computed in a background thread) were ready.

    .venv/bin/python scripts/benchmark_viewer.py [--sizes 1000 10000 50000] [--dir /tmp/viewer_bench]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetInfo, Features, Value

from hf_rollouts.schema import ROLLOUT_FEATURES, TASK_FEATURES

ROOT = Path(__file__).resolve().parents[1]
K = 4


def _nested(values: np.ndarray, lengths: np.ndarray, k: int, arrow_type: pa.DataType) -> pa.Array:
    """[row][rollout][token] from flat token ``values`` and each rollout's length."""
    inner = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32()), pa.array(values, arrow_type)
    )
    return pa.ListArray.from_arrays(pa.array(np.arange(0, len(lengths) + 1, k), pa.int32()), inner)


def synthetic(n: int, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    per_task = rng.integers(64, 193, n)
    lengths = np.repeat(per_task, K)
    total = int(lengths.sum())
    agent = (rng.random(total) < 0.3).astype(np.int8)
    rewards = rng.integers(0, 2, n * K).astype(np.float32)
    statuses = rng.choice(["done", "truncated", "error"], n * K, p=[0.8, 0.15, 0.05])
    rewards[statuses == "error"] = np.nan

    def per_rollout(values: list, arrow_type: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(np.arange(0, n * K + 1, K), pa.int32()), pa.array(values, arrow_type))

    message = ROLLOUT_FEATURES["conversations"].feature.feature
    conversations = [
        [
            [
                {"role": "user", "content": f"What is {r} + {i % 97}?"},
                {"role": "assistant", "content": f"The answer is {r + i % 97 + j}."},
            ]
            for j in range(K)
        ]
        for i, r in enumerate(rng.integers(0, 1000, n))
    ]
    columns = {
        "padded_full_token_ids": _nested(rng.integers(0, 32000, total), lengths, K, pa.int32()),
        "padded_full_attention_mask": _nested(np.ones(total, np.int8), lengths, K, pa.int8()),
        "padded_agent_token_mask": _nested(agent, lengths, K, pa.int8()),
        "padded_per_token_rewards": _nested(np.zeros(total, np.float32), lengths, K, pa.float32()),
        "padded_logprobs": _nested(np.where(agent, -rng.random(total), 0).astype(np.float32), lengths, K, pa.float32()),
        "final_rewards": per_rollout(rewards, pa.float32()),
        "num_turns": per_rollout(np.ones(n * K, np.int32), pa.int32()),
        "statuses": per_rollout(statuses.tolist(), pa.string()),
        "solved": per_rollout((rewards == 1).tolist(), pa.bool_()),
        "errors": per_rollout([None] * (n * K), pa.string()),
        "conversations": pa.array(
            conversations, pa.list_(pa.list_(Features({"m": message}).arrow_schema.field("m").type))
        ),
        "infos": per_rollout([json.dumps({"reason": "wrong answer"})] * (n * K), pa.string()),
    }
    tasks = Dataset.from_dict(
        {
            "env_class_path": ["hf_rollouts.envs.arithmetic.ArithmeticEnv"] * n,
            "env_config": ["{}"] * n,  # task rows store their dicts as exact JSON text (hf_rollouts.task_json)
            "task_data": [json.dumps({"a": int(i), "op": "+", "b": 1}) for i in range(n)],
        },
        features=TASK_FEATURES,
    )
    features = Features({**TASK_FEATURES, **{c: ROLLOUT_FEATURES[c] for c in columns}, "difficulty": Value("string")})
    table = pa.Table.from_arrays(
        [*tasks.data.table.columns, *columns.values(), pa.array(rng.choice(["easy", "hard"], n).tolist())],
        schema=features.arrow_schema,
    )
    return Dataset(table, info=DatasetInfo(features=features))


def rss_mb(pid: int) -> str:
    """Resident memory: all of it, and its anonymous part (what the process itself holds; the rest is mapped files,
    the Arrow data among them: page cache the kernel can drop), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    total, anon = (int(re.search(rf"{key}:\s+(\d+)", status)[1]) / 1024 for key in ("VmRSS", "RssAnon"))
    return f"{total:.0f} (anon {anon:.0f})"


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as response:
        return response.read()


def measure(path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hf_rollouts.cli", "view", str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        url = re.search(r"http://\S+/", proc.stdout.readline())[0]
        out = {"address_s": time.perf_counter() - started, "rss_open_mb": rss_mb(proc.pid)}
        t = time.perf_counter()
        for part in ("", "app.js", "app.css", "api/info", "api/summary", "api/tasks?offset=0&limit=50"):
            fetch(url + part)
        out["first_page_s"] = time.perf_counter() - t
        out["rss_first_page_mb"] = rss_mb(proc.pid)
        for name, part in (("sorted_page_s", "api/tasks?sort=mean_reward&desc=1&offset=500"),
                           ("filtered_page_s", "api/tasks?status=error&where=difficulty:eq:hard"),
                           ("search_s", "api/tasks?q=answer%20is%20500"),
                           ("group_s", "api/group?row=123"), ("rollout_s", "api/rollout?row=123&i=1")):  # fmt: skip
            t = time.perf_counter()
            fetch(url + part)
            out[name] = time.perf_counter() - t
        while json.loads(fetch(url + "api/summary"))["stats"] is None:
            time.sleep(0.2)
        out["stats_ready_s"] = time.perf_counter() - started
        out["rss_after_mb"] = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out


def baseline_rss() -> str:
    code = (
        "import hf_rollouts.cli, hf_rollouts.viewer.server, re, pathlib\n"
        "status = pathlib.Path('/proc/self/status').read_text()\n"
        "print(*(int(re.search(k + r':\\s+(\\d+)', status)[1]) // 1024 for k in ('VmRSS', 'RssAnon')))"
    )
    total, anon = subprocess.check_output(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}
    ).split()
    return f"{int(total)} (anon {int(anon)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/viewer_bench"))
    args = parser.parse_args()
    print(f"baseline: a process that imports hf_rollouts and the viewer holds {baseline_rss()} MB")
    for n in args.sizes:
        path = args.dir / f"rows{n}"
        if not (path / "state.json").is_file():
            t = time.perf_counter()
            synthetic(n).save_to_disk(str(path))
            print(f"wrote {n} rows in {time.perf_counter() - t:.1f} s")
        size = sum(f.stat().st_size for f in path.glob("*.arrow")) / 2**20
        result = measure(path)
        rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
        print(json.dumps({"rows": n, "arrow_mb": round(size), **rounded}))


if __name__ == "__main__":
    main()
