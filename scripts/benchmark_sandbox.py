"""What the code sandbox costs: verifications per second through bubblewrap against a plain subprocess (same harness,
same limits, no isolation), 1 and 8 at once; and a HumanEval rollout run's wall time with the `code` verifier against
the same run with an instant verifier.

    PYTHONPATH=. python scripts/benchmark_sandbox.py [--n 48] [--tasks 32] [--rollouts 4] [--max-new-tokens 48]

Part 1 runs HumanEval's canonical solutions (all pass) through `Sandbox.arun`. Part 2 plays HumanEval rows with the
embedded tiny model (random weights: its replies are text, not code); with `extraction: "whole"` every reply is sent
to the sandbox as the program (where it fails to compile), so each reply costs one sandbox start, overlapping the
generation of the other episodes; the instant verifier answers at once. Both sides in one process, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass

from hf_rollouts.aio import ENGINE_LOOP
from hf_rollouts.envs.dataset import humaneval_tasks
from hf_rollouts.sandbox import UNSAFE, Sandbox, SandboxLimits
from hf_rollouts.verify import Verdict, Verifier, register_verifier


@register_verifier("instant")
@dataclass(frozen=True)
class Instant(Verifier):
    """Answers at once (reward 0): what a run costs without verification."""

    def score(self, reply, answer, task):
        return Verdict(0.0, "instant", {})


def rate(backend: str, concurrency: int, rows) -> float:
    sandbox = Sandbox(SandboxLimits(), max_concurrency=concurrency, backend=backend)

    async def all_of():
        jobs = [json.loads(r["task_data"]) for r in rows]
        programs = [f"{t['code_prefix']}\n{r['canonical_solution']}\n" for t, r in zip(jobs, rows)]
        return await asyncio.gather(
            *[sandbox.arun("tests", p, t["test"], entry_point=t["entry_point"]) for p, t in zip(programs, jobs)]
        )

    ENGINE_LOOP.call(all_of())  # warm-up (page cache, the probe)
    start = time.perf_counter()
    results = ENGINE_LOOP.call(all_of())
    seconds = time.perf_counter() - start
    assert all(r.passed for r in results), [r.reason for r in results if not r.passed][:3]
    return len(rows) / seconds


def run_seconds(tasks, agent, verifier: str, rollouts: int, tmp: str) -> tuple[float, list]:
    from hf_rollouts.pipeline import generate_rollouts

    rows = tasks.map(lambda r: {"env_config": {"verifier": verifier, "extraction": "whole"}})
    start = time.perf_counter()
    out = generate_rollouts(rows, agent, rollouts, cache_dir=tmp, progress=False, load_from_cache_file=False)
    return time.perf_counter() - start, [s for row in out["statuses"] for s in row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=48, help="verifications per measurement")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    tasks = humaneval_tasks()
    rows = [tasks[i % len(tasks)] for i in range(args.n)]
    print(f"verifications per second ({args.n} HumanEval canonical solutions, all passing)")
    for concurrency in (1, 8):
        boxed, plain = rate("bwrap", concurrency, rows), rate(UNSAFE, concurrency, rows)
        print(
            f"  {concurrency} at once: sandbox {boxed:6.1f}/s, plain subprocess {plain:6.1f}/s, "
            f"sandbox/plain {boxed / plain:.2f}"
        )

    import tempfile

    from hf_rollouts.agents import SamplingConfig, load_agent

    agent = load_agent("tiny", SamplingConfig(max_new_tokens=args.max_new_tokens))
    subset = tasks.select(range(args.tasks))
    with tempfile.TemporaryDirectory() as tmp:
        run_seconds(subset.select(range(2)), agent, "instant", 1, tmp)  # warm-up
        code_s, code_status = run_seconds(subset, agent, "code", args.rollouts, tmp)
        instant_s, instant_status = run_seconds(subset, agent, "instant", args.rollouts, tmp)
    episodes = args.tasks * args.rollouts
    size = f"{args.tasks} tasks x {args.rollouts} rollouts, {args.max_new_tokens} new tokens"
    print(f"HumanEval rollout run, tiny model, {size}")
    print(f"  code verifier (a sandbox run per reply): {code_s:.1f} s   statuses {sorted(set(code_status))}")
    print(f"  instant verifier:                        {instant_s:.1f} s   statuses {sorted(set(instant_status))}")
    print(f"  code/instant {code_s / instant_s:.2f} ({episodes} episodes)")


if __name__ == "__main__":
    main()
