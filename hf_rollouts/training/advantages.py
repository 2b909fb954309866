"""Scoring and filtering the rollouts of a group (a task row): advantages, drop reasons, the report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

AdvantageMode = Literal["grpo", "mean_baseline", "per_token"]
ADVANTAGE_MODES: tuple[str, ...] = ("grpo", "mean_baseline", "per_token")

DROP_REASONS: tuple[str, ...] = ("error", "truncated", "constant_group")
"""Why a rollout is dropped, in precedence order: a rollout that is both an error
and in a constant group is counted once, as ``"error"``."""


@dataclass(frozen=True)
class RolloutFilter:
    """What :func:`prepare_rollouts` drops and how it scores rollouts.

    Attributes:
        drop_errors: drop ``error`` rollouts (they are always excluded from the
            group statistics, and never trained on even when kept).
        keep_truncated: keep ``truncated`` rollouts (budget ran out). They always
            count in the group statistics.
        drop_constant_groups: drop groups whose non-error final rewards are all
            equal (zero GRPO signal). A group with a single non-error rollout is
            constant.
        advantage: one of :data:`ADVANTAGE_MODES`.
        eps: added to the group std in ``"grpo"`` mode.
    """

    drop_errors: bool = True
    keep_truncated: bool = True
    drop_constant_groups: bool = False
    advantage: AdvantageMode = "grpo"
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, got {self.advantage!r}.")
        if not self.eps >= 0:
            raise ValueError(f"eps must be >= 0, got {self.eps}.")


@dataclass(frozen=True)
class RolloutFilterReport:
    """Counts of one :func:`prepare_rollouts` call. Rollout counts satisfy
    ``rollouts_in == rollouts_out + errors_dropped + truncated_dropped + constant_group_rollouts_dropped``.

    Attributes:
        groups_in / rollouts_in: task rows and rollouts read.
        errors / truncated: error and truncated rollouts seen (dropped or not).
        errors_dropped / truncated_dropped: of those, how many were dropped.
        constant_groups: groups whose non-error final rewards are all equal.
        constant_groups_dropped: groups dropped for that reason
            (``drop_constant_groups=True``), and ``constant_group_rollouts_dropped``
            the rollouts that went with them (not already counted as errors or
            truncated).
        groups_out / rollouts_out: groups with at least one kept rollout, and kept rollouts.
    """

    groups_in: int = 0
    rollouts_in: int = 0
    errors: int = 0
    errors_dropped: int = 0
    truncated: int = 0
    truncated_dropped: int = 0
    constant_groups: int = 0
    constant_groups_dropped: int = 0
    constant_group_rollouts_dropped: int = 0
    groups_out: int = 0
    rollouts_out: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def nothing_to_learn(self) -> bool:
        """No rollout kept: the round is an empty step (no optimizer step, no change to the policy)."""
        return self.rollouts_out == 0

    @property
    def kept_group_fraction(self) -> float:
        """``groups_out / groups_in``: the share of the round's tasks that still give a learning signal (NaN for
        a round of no groups)."""
        return self.groups_out / self.groups_in if self.groups_in else math.nan

    def low_signal_warning(self, min_fraction: float) -> str | None:
        """A warning when this round kept fewer than ``min_fraction`` of its groups (``None`` otherwise, and for a
        round of no groups): how many were kept, why the rest were dropped, and the usual remedies."""
        if not self.groups_in or self.kept_group_fraction >= min_fraction:
            return None
        other = self.groups_in - self.groups_out - self.constant_groups_dropped
        why = f"{self.constant_groups_dropped} had the same reward in every rollout (no GRPO signal)"
        why += f", {other} lost every rollout to errors or truncation" if other else ""
        outcome = "nothing to learn from, no optimizer step" if self.nothing_to_learn else "few optimizer steps"
        return (
            f"the round kept {self.groups_out}/{self.groups_in} groups ({self.kept_group_fraction:.0%}, below "
            f"{min_fraction:.0%}): {why}; {outcome}. Usual remedies: more rollouts per task, a higher sampling "
            "temperature, tasks nearer the policy's level (harder when most groups all succeed, easier when most "
            "all fail)."
        )

    def __str__(self) -> str:
        text = (
            f"{self.rollouts_out}/{self.rollouts_in} rollouts kept in {self.groups_out}/{self.groups_in} groups; "
            f"dropped: {self.errors_dropped} error (of {self.errors}), {self.truncated_dropped} truncated "
            f"(of {self.truncated}), {self.constant_group_rollouts_dropped} in {self.constant_groups_dropped} "
            f"constant groups (of {self.constant_groups})"
        )
        return text + ("; nothing to learn from in this round" if self.nothing_to_learn else "")


def _is_error(status: str, reward: float | None) -> bool:
    return status == "error" or reward is None or not math.isfinite(reward)


def group_advantages(
    final_rewards: Sequence[float | None], statuses: Sequence[str], mode: str, eps: float = 1e-6
) -> list[float]:
    """One advantage per rollout of a group; NaN for error rollouts (and for every rollout in ``"per_token"`` mode).

    Statistics use the non-error rollouts only; std is the population std (ddof=0).
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, got {mode!r}.")
    ok = [float(r) for r, s in zip(final_rewards, statuses) if not _is_error(s, r)]
    if mode == "per_token" or not ok:
        return [math.nan] * len(final_rewards)
    mean = sum(ok) / len(ok)
    std = math.sqrt(sum((r - mean) ** 2 for r in ok) / len(ok))
    out = []
    for r, s in zip(final_rewards, statuses):
        if _is_error(s, r):
            out.append(math.nan)
        elif mode == "grpo":
            out.append((float(r) - mean) / (std + eps))
        else:
            out.append(float(r) - mean)
    return out


def _is_constant(final_rewards: Sequence[float | None], statuses: Sequence[str]) -> bool:
    ok = [float(r) for r, s in zip(final_rewards, statuses) if not _is_error(s, r)]
    return bool(ok) and all(r == ok[0] for r in ok)


def drop_reasons(final_rewards: Sequence[float | None], statuses: Sequence[str], opts: RolloutFilter) -> list[str]:
    """Per rollout: ``""`` (kept) or the first applicable reason of :data:`DROP_REASONS`."""
    constant = opts.drop_constant_groups and _is_constant(final_rewards, statuses)
    reasons = []
    for r, s in zip(final_rewards, statuses):
        if opts.drop_errors and _is_error(s, r):
            reasons.append("error")
        elif not opts.keep_truncated and s == "truncated":
            reasons.append("truncated")
        elif constant:
            reasons.append("constant_group")
        else:
            reasons.append("")
    return reasons


def filter_report(
    final_rewards: Sequence[Sequence[float | None]], statuses: Sequence[Sequence[str]], opts: RolloutFilter
) -> tuple[RolloutFilterReport, list[int]]:
    """What :class:`RolloutFilter` ``opts`` does to groups of rollouts (one ``final_rewards`` / ``statuses`` list per
    group): the counts, and the indices of the groups that keep at least one rollout."""
    counts = dict.fromkeys(RolloutFilterReport.__dataclass_fields__, 0)
    kept_groups = []
    for g, (rewards, stats) in enumerate(zip(final_rewards, statuses)):
        if len(rewards) != len(stats):
            raise ValueError(
                f"row {g}: {len(rewards)} final_rewards but {len(stats)} statuses; the rollout data is corrupt."
            )
        reasons = drop_reasons(rewards, stats, opts)
        counts["groups_in"] += 1
        counts["rollouts_in"] += len(rewards)
        counts["errors"] += sum(_is_error(s, r) for r, s in zip(rewards, stats))
        counts["truncated"] += sum(s == "truncated" for s in stats)
        counts["errors_dropped"] += reasons.count("error")
        counts["truncated_dropped"] += reasons.count("truncated")
        if _is_constant(rewards, stats):
            counts["constant_groups"] += 1
            if opts.drop_constant_groups:
                counts["constant_groups_dropped"] += 1
        counts["constant_group_rollouts_dropped"] += reasons.count("constant_group")
        kept = reasons.count("")
        counts["rollouts_out"] += kept
        if kept:
            counts["groups_out"] += 1
            kept_groups.append(g)
    return RolloutFilterReport(**counts), kept_groups
