"""Run tracking of a training run (``--report-to trackio``, as TRL's ``report_to``): each round's metrics, besides
``metrics.json``, and a sample of its rollouts as a table.

trackio (Hugging Face's local-first tracker) is imported here only, when asked for. It writes one SQLite database a
project (``TRACKIO_DIR/<project>.db``, media beside it) and reads ``TRACKIO_DIR`` once, when it is first imported: a
run sets it to ``OUTPUT_DIR/trackio`` before that unless the user set it. Nothing goes to the network: no
``space_id``, ``server_url`` or ``dataset_id`` is passed (those are trackio's only remote paths), the dashboard is
never launched (``embed=False``) and its system-metrics threads stay off. ``trackio show --project hf_rollouts``
(with the same ``TRACKIO_DIR``) opens the dashboard on the logged runs.

:func:`round_metrics` flattens a round's :class:`~hf_rollouts.recipes.runs.IterationStats` into the scalars logged
(``reward/mean``, ``solve_rate``, ``groups/kept``, ``logprob_gap/*``, ``importance_weight/*``, ``time/*``,
``tokens_per_second``, ``heldout/*``); :func:`rollout_table` is the sample of a round's rollouts.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

PROJECT = "hf_rollouts"


def round_metrics(stats: Any) -> dict[str, float]:
    """The scalars of one round (NaN and missing values left out: trackio plots what is there)."""
    s = stats
    out = {"reward/mean": s.mean_reward, "solve_rate": s.solve_rate, "loss": s.loss, "grad_norm": s.grad_norm,
           "clip_fraction": s.clip_fraction, "approx_kl": s.approx_kl, "rollouts/trained": s.trained_rollouts,
           "rollouts/total": s.rollouts, "rollouts/errors": s.errors, "tool_rate": s.tool_rate,
           "time/round": s.seconds}  # fmt: skip
    out |= {f"groups/{k}": v for k, v in (s.groups or {}).items()}
    out |= {f"time/{k}": v for k, v in (s.phases or {}).items()}
    gap = s.logprob_gap or {}
    out |= {f"logprob_gap/{k}": v for k, v in gap.items() if isinstance(v, (int, float))}
    out |= {f"importance_weight/{k}": v for k, v in (s.importance or {}).items()}
    if s.agent_tokens is not None:
        out["agent_tokens"] = s.agent_tokens
        collect = (s.phases or {}).get("collect")
        if collect:
            out["tokens_per_second"] = s.agent_tokens / collect
    if s.heldout:
        out |= {f"heldout/{k}": s.heldout[k] for k in ("success", "low", "high", "mean_reward") if k in s.heldout}
    return {k: float(v) for k, v in out.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}


def rollout_table(rollouts: Any, n: int) -> tuple[list[str], list[list[Any]]]:
    """``(columns, rows)``: the first ``n`` rollouts of a round (one per row of the first groups, then the next
    rollout of each group...): the task, the rollout's index, status, final reward, solved, and its conversation."""
    import json

    columns = ["task", "rollout", "status", "final_reward", "solved", "conversation"]
    rows: list[list[Any]] = []
    if not n:
        return columns, rows
    head = rollouts.select(range(min(len(rollouts), n)))
    for r in head:
        for i, status in enumerate(r["statuses"]):
            if len(rows) >= n:
                break
            chat = "\n".join(f"{m['role']}: {m['content']}" for m in (r["conversations"] or [[]])[i] or [])
            solved = r["solved"][i] if r.get("solved") is not None else None
            rows.append([json.dumps(r["task_data"]) if not isinstance(r["task_data"], str) else r["task_data"], i,
                         status, float(r["final_rewards"][i]), solved, chat])  # fmt: skip
    return columns, rows


class TrackioRun:
    """One trackio run of a training run (``resume="allow"``: a resumed run logs on under the same name)."""

    def __init__(self, output_dir: str | None, name: str | None, config: dict[str, Any]):
        wanted = os.environ.setdefault("TRACKIO_DIR", str(Path(output_dir or ".") / "trackio"))
        try:
            import trackio
        except ImportError as exc:
            raise ImportError(
                "--report-to trackio needs trackio: pip install 'hf_rollouts[trackio]' (or 'trackio==0.43.*')."
            ) from exc
        from trackio.utils import TRACKIO_DIR

        if Path(TRACKIO_DIR) != Path(wanted):  # trackio was imported earlier in this process, with another dir
            print(f"warning: trackio logs to {TRACKIO_DIR} (TRACKIO_DIR when it was first imported), not {wanted}",
                  file=sys.stderr)  # fmt: skip
        self.trackio, self.directory = trackio, Path(TRACKIO_DIR)
        self.name = name or Path(output_dir or "run").name
        self.run = trackio.init(project=PROJECT, name=self.name, config=config, resume="allow", embed=False,
                                auto_log_cpu=False, auto_log_gpu=False)  # fmt: skip

    def log_round(self, step: int, metrics: dict[str, float], table: tuple[list[str], list[list[Any]]] | None):
        """Log a round's scalars (and its rollouts' table) at ``step``."""
        logged: dict[str, Any] = dict(metrics)
        if table and table[1]:
            logged["rollouts"] = self.trackio.Table(columns=table[0], data=table[1])
        self.trackio.log(logged, step=step)

    def log_heldout(self, step: int, heldout: dict[str, Any] | None, tag: str) -> None:
        """A held-out evaluation outside a round (the base rate, before round 0)."""
        if heldout:
            self.trackio.log({f"heldout/{k}": float(heldout[k]) for k in ("success", "low", "high")}, step=step)

    def finish(self) -> None:
        self.trackio.finish()


def open_tracker(report_to: str, output_dir: str | None, name: str | None, config: dict[str, Any]):
    """The tracker ``report_to`` names (``None`` for ``"none"``)."""
    if report_to == "none":
        return None
    if report_to == "trackio":
        return TrackioRun(output_dir, name, config)
    raise ValueError(f"--report-to must be 'none' or 'trackio', got {report_to!r}.")


__all__ = ["PROJECT", "TrackioRun", "open_tracker", "rollout_table", "round_metrics"]
