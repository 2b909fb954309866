"""Synchronous rounds against overlapped ones (``--max-staleness 1``), side by side in one run, two seeds or more.

Runs :func:`hf_rollouts.recipes.train.train` (what ``hf-rollouts train`` runs) in this process on two tasks, each
seed with ``--max-staleness 0`` (today's loop) and ``--max-staleness 1`` (round k+1 collected while round k trains,
:mod:`hf_rollouts.recipes.overlap`), in alternating order:

* ``arithmetic``: the arithmetic env, compute-bound (generation and the update share the cores); the tiny model's
  ``small`` size, 2 PPO epochs;
* ``arithmetic-vllm``: the same with ``--backend vllm`` (the in-process engine samples in its own processes, the
  collector syncs it between rounds, the held-out evaluations wait for the round in flight); run it in the vLLM
  venv (``bash scripts/setup_vllm.sh --check`` prints its python; ``PYTHONPATH=.``);
* ``waiting``: guess the number (1-6, 4 turns) with an env step that waits 0.2 s on I/O
  (:class:`~hf_rollouts.envs.guess_number.WaitingGuessNumberEnv`), where the update can run in the wait; the tiny
  model, 4 PPO epochs.

``arithmetic`` and ``waiting`` (the default ``--tasks``) sample with the transformers agent. Every run: 8 tasks x 4
rollouts a round, 6 rounds, and keep constant groups (``--keep-constant-groups``: the random tiny model solves too
few rollouts for most groups to have a reward spread, so without it most rounds would take no update and there
would be nothing to overlap; a zero-advantage group costs the update's compute and moves no weight).

Prints per task and mode: the mean round wall and phases (``collect``,
``update``, ``sync``; round 0 included: it cannot overlap), the ratio overlapped / synchronous, held-out success
before -> after with 95% Wilson intervals, and per round the sampler/trainer log-prob gap and the importance weights
(the update's, ``--importance-sampling-cap 2``). Writes ``OUTPUT_DIR/benchmark_overlap.json``. On a shared machine
timings are only comparable within one run: quote the ratios::

    python scripts/benchmark_overlap.py --seeds 0 1 --output-dir outputs/bench_overlap
    PYTHONPATH=. $(bash scripts/setup_vllm.sh --check) scripts/benchmark_overlap.py --tasks arithmetic-vllm \
        --output-dir outputs/bench_overlap_vllm
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

from hf_rollouts.recipes.train import train
from hf_rollouts.recipes.train_config import TrainConfig

TASKS = {
    "arithmetic": {"env": "arithmetic", "max_new_tokens": 6, "model_size": "small", "ppo_epochs": 2},
    "arithmetic-vllm": {
        "env": "arithmetic",
        "max_new_tokens": 6,
        "model_size": "small",
        "ppo_epochs": 2,
        "backend": "vllm",
        "kv_cache_gib": 0.25,
    },  # fmt: skip
    "waiting": {
        "env": "hf_rollouts.envs.guess_number.WaitingGuessNumberEnv",
        "max_new_tokens": 3,
        "env_config": json.dumps({"high": 6, "max_turns": 4, "step_wait_s": 0.2}),
        "model_size": "tiny",
        "ppo_epochs": 4,
    },
}
PHASES = ("collect", "update", "sync")


def interval(h: dict | None) -> str:
    return "-" if not h else f"{h['success']:.3f} [{h['low']:.3f}, {h['high']:.3f}]"


def one_run(task: str, seed: int, staleness: int, args: argparse.Namespace) -> dict:
    cfg = TrainConfig(
        **TASKS[task], model=args.model, seed=seed, iterations=args.iterations, tasks_per_iter=args.tasks_per_iter,
        num_rollouts=args.num_rollouts, minibatch_size=args.minibatch_size, eval_tasks=args.eval_tasks,
        importance_sampling_cap=2.0, max_staleness=staleness, keep_constant_groups=True, quiet=True, plot="none",
        output_dir=str(Path(args.output_dir) / f"{task}-s{seed}-m{staleness}"),
    )  # fmt: skip
    began = time.perf_counter()
    history = train(cfg)
    wall = time.perf_counter() - began
    summary = json.loads((Path(cfg.output_dir) / "summary.json").read_text())
    rounds = [dataclasses.asdict(s) for s in history]
    return {
        "task": task, "seed": seed, "max_staleness": staleness, "wall_s": wall,
        "round_s": [r["seconds"] for r in rounds],  # the evaluations left out
        "phases_s": {p: [r["phases"].get(p, 0.0) for r in rounds] for p in PHASES},
        "logprob_gap_max": [(r["logprob_gap"] or {}).get("max_abs") for r in rounds],
        "importance_mean": [(r["importance"] or {}).get("mean") for r in rounds],
        "dropped": [(r["staleness"] or {}).get("rollouts_dropped", 0) for r in rounds],
        "heldout_before": summary.get("heldout_before"), "heldout_after": summary.get("heldout_after"),
    }  # fmt: skip


def show(runs: list[dict]) -> None:
    print(f"{'task':>15} {'seed':>4} {'stale':>5} | {'round s':>7} {'collect':>7} {'update':>7} {'sync':>6} | "
          f"{'held-out before':>22} -> {'after':>22}")  # fmt: skip
    for r in runs:
        mean = {p: statistics.mean(v) for p, v in r["phases_s"].items()}
        print(f"{r['task']:>15} {r['seed']:>4} {r['max_staleness']:>5} | {statistics.mean(r['round_s']):>7.3f} "
              f"{mean['collect']:>7.3f} {mean['update']:>7.3f} {mean['sync']:>6.3f} | "
              f"{interval(r['heldout_before']):>22} -> {interval(r['heldout_after']):>22}")  # fmt: skip
    print("\nper round: log-prob gap max | importance weight mean | rollouts dropped")
    for r in runs:
        fmt = lambda xs: " ".join("-" if x is None or x != x else f"{x:.3g}" for x in xs)  # noqa: E731
        print(f"{r['task']:>15} s{r['seed']} m{r['max_staleness']}: gap {fmt(r['logprob_gap_max'])} | "
              f"weight {fmt(r['importance_mean'])} | dropped {r['dropped']}")  # fmt: skip
    print("\nround wall, overlapped / synchronous (same task and seed):")
    for task in TASKS:
        for seed in sorted({r["seed"] for r in runs}):
            pair = {r["max_staleness"]: r for r in runs if r["task"] == task and r["seed"] == seed}
            if 0 in pair and 1 in pair:
                ratio = statistics.mean(pair[1]["round_s"]) / statistics.mean(pair[0]["round_s"])
                later = statistics.mean(pair[1]["round_s"][1:]) / statistics.mean(pair[0]["round_s"][1:])
                whole = pair[1]["wall_s"] / pair[0]["wall_s"]
                print(f"  {task:>15} seed {seed}: round {ratio:.2f} (rounds 1.. {later:.2f}), whole run "
                      f"(evaluations included) {whole:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--tasks", nargs="+", default=["arithmetic", "waiting"], choices=list(TASKS))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--tasks-per-iter", type=int, default=8)
    parser.add_argument("--num-rollouts", type=int, default=4)
    parser.add_argument("--minibatch-size", type=int, default=8)
    parser.add_argument("--eval-tasks", type=int, default=32)
    parser.add_argument("--output-dir", default="outputs/bench_overlap")
    args = parser.parse_args(argv)
    runs = []
    for task in args.tasks:
        for i, seed in enumerate(args.seeds):
            for staleness in (0, 1) if i % 2 == 0 else (1, 0):  # alternate the order against drift
                runs.append(one_run(task, seed, staleness, args))
    show(runs)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark_overlap.json").write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
