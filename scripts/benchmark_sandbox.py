"""What the code sandbox costs: verifications per second with the tests in a sandboxed process of their own (the
default: two sandboxes per verification) against the tests in the code's process (`same_process`, one sandbox, as
HumanEval's harness does) and against a plain subprocess (same harness, same limits, no isolation), 1 and 8 at once,
side by side in one run; and a HumanEval rollout run's wall time with the `code` verifier against the same run with an
instant verifier.

    PYTHONPATH=. python scripts/benchmark_sandbox.py [--n 48] [--tasks 32] [--rollouts 4] [--max-new-tokens 48]
        [--skip-run]

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


MODES = {  # name: (backend, same_process)
    "apart": ("bwrap", False),  # the default: the tests in a sandbox of their own, the code in a second one
    "together": ("bwrap", True),  # the tests in the code's sandbox (same_process), HumanEval's own way
    "plain": (UNSAFE, True),  # no isolation: a plain subprocess, same harness and limits
}


def rates(concurrency: int, rows, block: int = 8) -> dict[str, float]:
    """Verifications per second of each mode: the rows' canonical solutions against their tests, the modes taking
    turns block by block (the order rotating), so that a shared machine's load weighs on each alike."""
    sandboxes = {m: Sandbox(SandboxLimits(), max_concurrency=concurrency, backend=b) for m, (b, _) in MODES.items()}

    async def verify(mode, chunk):
        jobs = [json.loads(r["task_data"]) for r in chunk]  # task rows store exact JSON text
        runs = [
            sandboxes[mode].arun(
                "tests",
                f"{t['code_prefix']}\n{r['canonical_solution']}\n",
                t["test"],
                entry_point=t["entry_point"],
                prefix=t["code_prefix"],
                same_process=MODES[mode][1],
            )
            for t, r in zip(jobs, chunk)
        ]
        results = await asyncio.gather(*runs)
        assert all(r.passed for r in results), [r.reason for r in results if not r.passed][:3]

    for mode in MODES:  # warm-up (page cache, the probe)
        ENGINE_LOOP.call(verify(mode, rows[:block]))
    seconds = dict.fromkeys(MODES, 0.0)
    for turn, at in enumerate(range(0, len(rows), block)):
        order = list(MODES)[turn % 3 :] + list(MODES)[: turn % 3]
        for mode in order:
            start = time.perf_counter()
            ENGINE_LOOP.call(verify(mode, rows[at : at + block]))
            seconds[mode] += time.perf_counter() - start
    return {mode: len(rows) / s for mode, s in seconds.items()}


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
    parser.add_argument("--skip-run", action="store_true", help="measure the verifications only (part 1)")
    args = parser.parse_args()
    tasks = humaneval_tasks()
    rows = [tasks[i % len(tasks)] for i in range(args.n)]
    print(f"verifications per second ({args.n} HumanEval canonical solutions, all passing)")
    for concurrency in (1, 8):
        rate = rates(concurrency, rows)
        print(
            f"  {concurrency} at once: tests in a sandbox of their own {rate['apart']:6.1f}/s, tests in the code's "
            f"sandbox {rate['together']:6.1f}/s, own/code's {rate['apart'] / rate['together']:.2f}; plain subprocess "
            f"{rate['plain']:6.1f}/s, code's sandbox/plain {rate['together'] / rate['plain']:.2f}"
        )
    if args.skip_run:
        return

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
