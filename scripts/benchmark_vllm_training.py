"""Our GRPO loop with the transformers agent sampling and with the vLLM agent sampling, side by side in one run.

Runs ``scripts/train_grpo.py``'s :func:`train` twice in this process, with the same model, task, rounds and seeds,
``--backend transformers`` then ``--backend vllm``, each with ``--logprob-gap``, and prints per backend: the wall
time per round and per phase (``collect``: playing the round; ``update``: prepare + ``grpo_update``; ``sync``:
weights into the engine; ``gap``: the sampler/trainer log-prob gap, measured, not needed to train), the whole
run's wall (the engine's start included), the gap per round and held-out success before and after (95% Wilson
intervals). Writes ``OUTPUT_DIR/benchmark.json``. Run it in the vLLM venv (``bash scripts/setup_vllm.sh``)::

    python scripts/benchmark_vllm_training.py --model PATH_TO_SMOLLM2 --env arithmetic --iterations 4 \\
        --tasks-per-iter 8 --num-rollouts 8 --minibatch-size 16 --lr 3e-5 --temperature 0.7 --max-new-tokens 12 \\
        --trainable-layers 10 --eval-tasks 64 --output-dir outputs/bench_vllm_training

Every flag is ``train_grpo.py``'s (``--backend`` and ``--logprob-gap`` are set here). Timings on a shared machine
are only comparable within one run: quote the ratios.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "train_grpo.py"
BACKENDS = ("transformers", "vllm")
PHASES = ("collect", "update", "sync", "gap")


def load_train_grpo():
    spec = importlib.util.spec_from_file_location("train_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_grpo"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(argv: list[str]) -> dict:
    """Both backends on ``argv`` (``train_grpo.py`` flags); the figures per backend."""
    script = load_train_grpo()
    base = script.parse_args(argv)
    out: dict = {"command": ["python", "scripts/benchmark_vllm_training.py", *argv]}
    for backend in BACKENDS:
        cfg = dataclasses.replace(
            base, backend=backend, logprob_gap=True, output_dir=str(Path(base.output_dir) / backend), plot="none"
        )
        started = time.perf_counter()
        history = script.train(cfg)
        wall = time.perf_counter() - started
        summary = json.loads((Path(cfg.output_dir) / "summary.json").read_text())
        rounds = [dataclasses.asdict(s) for s in history]
        out[backend] = {
            "wall_s": wall,
            "round_s": [r["seconds"] - r["phases"].get("gap", 0.0) for r in rounds],  # what training needs
            "phases_s": {p: [r["phases"].get(p, 0.0) for r in rounds] for p in PHASES},
            "logprob_gap_max": [r["logprob_gap"]["max_abs"] for r in rounds],
            "mean_reward": [r["mean_reward"] for r in rounds],
            "trained_rollouts": [r["trained_rollouts"] for r in rounds],
            "heldout_before": summary.get("heldout_before"),
            "heldout_after": summary.get("heldout_after"),
        }
    return out


def report(result: dict) -> str:
    lines = [f"{'':>13} | {'round':>6} | " + " | ".join(f"{p:>7}" for p in PHASES) + f" | {'run':>6} | held-out"]
    for backend in BACKENDS:
        r = result[backend]
        phases = " | ".join(f"{statistics.mean(r['phases_s'][p]):>7.2f}" for p in PHASES)
        held = [r["heldout_before"], r["heldout_after"]]
        held_text = " -> ".join(f"{h['success']:.3f} [{h['low']:.3f}, {h['high']:.3f}]" if h else "-" for h in held)
        lines.append(
            f"{backend:>13} | {statistics.mean(r['round_s']):>6.2f} | {phases} | {r['wall_s']:>6.1f} | {held_text}"
        )
    t, v = result["transformers"], result["vllm"]
    collect = statistics.mean(v["phases_s"]["collect"]) / statistics.mean(t["phases_s"]["collect"])
    rounds = statistics.mean(v["round_s"]) / statistics.mean(t["round_s"])
    lines.append(f"vLLM / transformers: collect {collect:.2f}, round {rounds:.2f}, run {v['wall_s'] / t['wall_s']:.2f}")
    lines.append(f"max log-prob gap per round: transformers {t['logprob_gap_max']}, vllm {v['logprob_gap_max']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    result = run(argv)
    text = report(result)
    print(text)
    out = Path(load_train_grpo().parse_args(argv).output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps({**result, "table": text}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
