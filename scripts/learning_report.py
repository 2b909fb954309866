"""One figure and one JSON from several training runs: learning curves and held-out success, trained vs control.

Reads the ``summary.json`` that ``scripts/train_grpo.py`` and ``scripts/train_trl.py`` write to their output
directory (and, for a train_grpo run without ``steps`` in it, its ``metrics.json``)::

    python scripts/learning_report.py --out docs/learning_arithmetic --title "SmolLM2-135M, arithmetic" \\
        --run "GRPO (our loop)=outputs/runs/grpo_arith" --run "control (our loop)=outputs/runs/grpo_arith_control" \\
        --run "GRPO (TRL)=outputs/runs/trl_arith" --run "control (TRL)=outputs/runs/trl_arith_control"

writes ``OUT.png`` (top: the reward of the rollouts each step trained on; bottom: held-out success before and after,
with 95% Wilson intervals; a tool-call-rate panel when any run called tools) and ``OUT.json`` (per run: command,
held-out before/after with intervals (and ``base``, the model as loaded, when the run measured it), the change, wall
and CPU seconds, the step curve).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_run(path: Path) -> dict:
    summary = json.loads((path / "summary.json").read_text())
    if "steps" not in summary and (path / "metrics.json").is_file():  # an older train_grpo summary
        rows = json.loads((path / "metrics.json").read_text())
        summary["steps"] = [
            {"step": r["iteration"] + 1, "reward": r["mean_reward"], "tool_rate": r.get("tool_rate", 0.0)} for r in rows
        ]
    return summary


def figures(label: str, s: dict) -> dict:
    before, after, base = s.get("heldout_before") or {}, s.get("heldout_after") or {}, s.get("heldout_base") or {}
    keep = ("success", "low", "high", "successes", "episodes", "errors", "tool_rate")
    return {
        "label": label,
        "command": s.get("command"),
        **({"base": {k: base.get(k) for k in keep}} if base.get("successes") is not None else {}),
        "before": {k: before.get(k) for k in keep},
        "after": {k: after.get(k) for k in keep},
        "change": (after.get("success") or 0) - (before.get("success") or 0),
        "wall_seconds": round(s.get("wall_seconds", 0)),
        "cpu_seconds": round(s.get("cpu_seconds", 0)),
        "steps": [{k: r.get(k) for k in ("step", "reward", "tool_rate")} for r in s.get("steps", [])],
    }


def plot(runs: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping {path} (pip install 'hf_rollouts[plot]').", file=sys.stderr)
        return False
    tools = any(r["after"].get("tool_rate") or any(x.get("tool_rate") for x in r["steps"]) for r in runs)
    fig, axes = plt.subplots(3 if tools else 2, 1, figsize=(7.5, 8.5 if tools else 6.5))
    curve, heldout = axes[0], axes[-1]
    for k, r in enumerate(runs):
        color = f"C{k}"
        style = "--" if "control" in r["label"].lower() else "-"
        steps = [x["step"] for x in r["steps"]]
        curve.plot(steps, [x["reward"] for x in r["steps"]], style, marker=".", color=color, label=r["label"])
        if tools:
            axes[1].plot(steps, [x["tool_rate"] for x in r["steps"]], style, marker=".", color=color)
        for x, point in ((0, r["before"]), (1, r["after"])):
            if point.get("success") is None:
                continue
            y = point["success"]
            heldout.errorbar(
                x + 0.08 * (k - (len(runs) - 1) / 2),
                y,
                yerr=[[y - point["low"]], [point["high"] - y]],
                fmt="o" if style == "-" else "s",
                color=color,
                capsize=3,
                label=r["label"] if x == 0 else None,
            )
    curve.set_ylabel("training reward")
    curve.set_xlabel("round (a batch of rollouts from the current policy, then its updates)")
    curve.set_ylim(-0.02, 1.02)
    curve.legend(fontsize=8, loc="best")
    curve.set_title(title, fontsize=9)
    if tools:
        axes[1].set_ylabel("tool-call rate")
        axes[1].set_xlabel("round")
        axes[1].set_ylim(-0.02, 1.02)
    heldout.set_xticks([0, 1], ["before training", "after training"])
    heldout.set_xlim(-0.5, 1.5)
    heldout.set_ylim(-0.02, 1.02)
    heldout.set_ylabel("held-out success (95% CI)")
    heldout.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR (repeat).")
    parser.add_argument("--out", required=True, help="Output path without suffix: OUT.png and OUT.json.")
    parser.add_argument("--title", default="", help="Figure title.")
    args = parser.parse_args(argv)
    runs = []
    for spec in args.run:
        label, sep, where = spec.partition("=")
        if not sep:
            parser.error(f"--run wants LABEL=RUN_DIR, got {spec!r}")
        runs.append(figures(label, load_run(Path(where))))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"title": args.title, "runs": runs}, indent=1) + "\n")
    plot(runs, out.with_suffix(".png"), args.title)
    for r in runs:
        b, a = r["before"], r["after"]
        print(
            f"{r['label']}: {b['success']:.3f} [{b['low']:.3f}, {b['high']:.3f}] -> {a['success']:.3f} "
            f"[{a['low']:.3f}, {a['high']:.3f}] ({r['change']:+.3f}); "
            f"{r['wall_seconds']} s wall, {r['cpu_seconds']} s CPU"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
