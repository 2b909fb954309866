"""Rescoring speed: rows/s of ``rescore_rollouts`` with ``exact``, ``math`` (math-verify) and the tiny reward model,
on the same stored rollouts (the dataset env played by the tiny model), measured side by side in one process.

    python scripts/benchmark_rescore.py                 # 128 tasks x 4 rollouts, two passes each
    python scripts/benchmark_rescore.py --tasks 32 --rollouts 2

The extraction is ``whole``, so math-verify parses every reply (the tiny model writes no number: with
``last_number`` most replies would have no answer and cost nothing). Caching is off (``datasets.disable_caching``),
so every pass scores every rollout. One torch thread.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hf_rollouts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=128)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()

    import datasets
    import torch
    from datasets import Dataset

    from hf_rollouts import generate_rollouts
    from hf_rollouts.agents import SamplingConfig, load_agent
    from hf_rollouts.envs.dataset import to_task_rows
    from hf_rollouts.rescore import rescore_rollouts
    from hf_rollouts.tiny_model import tiny_reward_model_path

    torch.set_num_threads(1)
    datasets.disable_caching()
    datasets.disable_progress_bars()
    questions = Dataset.from_list([{"q": f"What is {i} + {i % 7}?", "a": str(i + i % 7)} for i in range(args.tasks)])
    tasks = to_task_rows(questions, prompt_column="q", answer_column="a", env_config={"extraction": "whole"})
    agent = load_agent("tiny", SamplingConfig(max_new_tokens=16))
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        stored = generate_rollouts(tasks, agent, num_rollouts=args.rollouts, seed=0, progress=False, cache_dir=cache)
        stored = Dataset.from_dict(stored.to_dict(), features=stored.features)  # in memory
        print(f"made {len(stored)} rows x {args.rollouts} rollouts in {time.perf_counter() - start:.1f} s")
        rm = str(tiny_reward_model_path(seed=0))
        verifiers = {
            "exact": "exact",
            "math": "math",
            "reward_model (tiny)": {"name": "reward_model", "model": rm},
        }
        for spec in verifiers.values():  # warm-up: imports, the reward model's load
            rescore_rollouts(stored.select(range(2)), spec, allowed_env_models=[rm])
        times: dict[str, list[float]] = {name: [] for name in verifiers}
        for _ in range(args.passes):  # interleaved
            for name, spec in verifiers.items():
                start = time.perf_counter()
                out = rescore_rollouts(stored, spec, allowed_env_models=[rm])
                times[name].append(time.perf_counter() - start)
                assert sum(map(sum, out["rescored"])) == len(stored) * args.rollouts
    rollouts = len(stored) * args.rollouts
    print(f"{'verifier':<22} {'rows/s':>8} {'rollouts/s':>11}   (best of {args.passes})")
    for name, seconds in times.items():
        best = min(seconds)
        print(f"{name:<22} {len(stored) / best:8.1f} {rollouts / best:11.1f}")


if __name__ == "__main__":
    main()
