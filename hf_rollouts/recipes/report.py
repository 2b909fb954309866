"""What a training run leaves behind: ``summary.json`` and the learning-curve figure (matplotlib, lazily).

``summary.json`` is what ``scripts/learning_report.py`` reads: ``command``, ``config``, ``heldout_before`` /
``heldout_after`` (:meth:`hf_rollouts.evaluation.Evaluation.as_dict`), ``steps`` (one row per round: ``step`` from
1, ``reward``, ``success``, ``tool_rate``), wall and CPU seconds of the process and its torch threads.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_summary(
    out_dir: str | Path,
    *,
    command: str | None,
    config: dict[str, Any],
    steps: Sequence[dict[str, Any]],
    started: tuple[float, float],
    **fields: Any,
) -> dict[str, Any]:
    """Write ``out_dir/summary.json`` and return it. ``started``: ``(time.perf_counter(), time.process_time())`` at
    the run's start; ``fields``: ``heldout_before``, ``heldout_after`` and whatever else the run reports."""
    import torch

    summary = {
        "command": command,
        "config": config,
        **fields,
        "steps": list(steps),
        "wall_seconds": time.perf_counter() - started[0],
        "cpu_seconds": time.process_time() - started[1],
        "torch_threads": torch.get_num_threads(),
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def save_learning_curve(
    path: str | Path,
    rounds: Sequence[dict[str, Any]],
    *,
    heldout: Sequence[tuple[float, dict[str, Any]]] = (),
    title: str = "",
    curves: Sequence[str] = ("reward", "success", "tool_rate"),
    xlabel: str = "round",
) -> bool:
    """A PNG of the per-round ``curves`` (keys of ``rounds``' dicts, drawn when present and not all zero or NaN),
    the held-out evaluations ``(x, Evaluation.as_dict())`` with their 95% intervals, and a lower panel with
    ``loss`` when the rounds have one. Returns False (with a message) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping {path} (pip install 'hf_rollouts[plot]').", file=sys.stderr)
        return False
    xs = [r["x"] for r in rounds]
    losses = [r.get("loss", math.nan) for r in rounds]
    has_loss = any(v is not None and not math.isnan(v) for v in losses)
    fig, axes = plt.subplots(2 if has_loss else 1, 1, figsize=(7, 6 if has_loss else 4), sharex=True, squeeze=False)
    top = axes[0][0]
    for key, style in zip(curves, ("-", "--", ":", "-.")):
        ys = [r.get(key, math.nan) for r in rounds]
        if any(y and not math.isnan(y) for y in ys):
            top.plot(xs, ys, linestyle=style, marker="o", markersize=3, label=key.replace("_", " "))
    if heldout:
        hx, evals = [p[0] for p in heldout], [p[1] for p in heldout]
        ys = [e["success"] for e in evals]
        errors = [[y - e["low"] for y, e in zip(ys, evals)], [e["high"] - y for y, e in zip(ys, evals)]]
        top.errorbar(hx, ys, yerr=errors, fmt="s", color="black", capsize=3, label="held-out success (95% CI)")
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("rate")
    top.legend(loc="upper left", fontsize=8)
    top.set_title(title, fontsize=8)
    if has_loss:
        axes[1][0].plot(xs, losses, marker=".", color="tab:red")
        axes[1][0].set_ylabel("loss")
    axes[-1][0].set_xlabel(xlabel)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"saved learning curve to {path}")
    return True
