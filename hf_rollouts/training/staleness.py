"""The staleness bound of overlapped training rounds, as pure functions on policy versions.

A *policy version* counts the updates the trainer has applied: version 0 is the starting weights, and the update of
a round turns version ``v`` into ``v + 1``. Every rollout records the version that sampled it (the
``policy_versions`` column, :data:`hf_rollouts.schema.ROLLOUT_COLUMNS`). A rollout's *staleness* when the trainer is
at version ``t`` is ``t - version``; an overlapped loop with ``max_staleness = s`` trains only on rollouts of
staleness ``0..s`` (``s = 0``: the synchronous loop, every round sampled by the weights it trains).

* :func:`first_allowed_version`: the oldest version that may sample round ``r`` (the collector of an overlapped loop
  waits for it before the round starts, so it never samples what would be dropped).
* :func:`staleness_filter`: which groups of a round a trainer at version ``t`` may train on; the dropped ones are
  counted (:class:`StalenessReport`), never silently lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field


def check_max_staleness(max_staleness: int) -> None:
    """``ValueError`` unless ``max_staleness`` is an int ``>= 0``."""
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"max_staleness must be an int >= 0 (0: the synchronous loop), got {max_staleness!r}.")


def first_allowed_version(round_index: int, max_staleness: int) -> int:
    """The oldest policy version that may sample round ``round_index`` (0-based) of a loop that trains once a round
    under ``max_staleness``: round ``r`` is trained by version ``r``, so ``max(0, r - max_staleness)``."""
    check_max_staleness(max_staleness)
    if round_index < 0:
        raise ValueError(f"round_index must be >= 0, got {round_index}.")
    return max(0, round_index - max_staleness)


@dataclass(frozen=True)
class StalenessReport:
    """What :func:`staleness_filter` kept and dropped.

    Attributes:
        keep: one bool per group (task row): train on it.
        rollouts_in / rollouts_out: rollouts before and after the filter.
        groups_dropped: groups dropped (a group is dropped whole when any of its rollouts is too old: GRPO's
            advantages are relative to the whole group).
        rollouts_dropped: rollouts in the dropped groups.
        staleness: ``{staleness: rollouts}`` of every rollout in (before the filter).
    """

    keep: list[bool]
    rollouts_in: int
    rollouts_out: int
    groups_dropped: int
    rollouts_dropped: int
    staleness: dict[int, int] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, object]:
        """The report as a round's metrics row (``staleness`` keys as strings, for JSON)."""
        return {"rollouts_dropped": self.rollouts_dropped, "groups_dropped": self.groups_dropped,
                "staleness": {str(k): v for k, v in sorted(self.staleness.items())}}  # fmt: skip


def staleness_filter(
    policy_versions: Sequence[Sequence[int | None]], trainer_version: int, max_staleness: int
) -> StalenessReport:
    """Which groups a trainer at ``trainer_version`` may train on under ``max_staleness``.

    ``policy_versions``: one list per group (the ``policy_versions`` column of a round), one version per rollout.
    A rollout is too old when ``trainer_version - version > max_staleness``; a group with any too-old rollout is
    dropped whole. A version newer than the trainer's, or ``None`` (a rollout no training loop recorded), is a
    ``ValueError`` naming the group: the loop that made it is wrong, and guessing would hide it.
    """
    check_max_staleness(max_staleness)
    keep, seen = [], Counter()
    rollouts_in = rollouts_out = dropped = 0
    for row, versions in enumerate(policy_versions):
        ages = []
        for k, version in enumerate(versions):
            if version is None or version > trainer_version:
                raise ValueError(f"policy_versions[{row}][{k}] is {version!r} with the trainer at version "
                                 f"{trainer_version}: collect rounds with collect_rollouts(..., policy_version=v) "
                                 "of a version the trainer has reached.")  # fmt: skip
            ages.append(trainer_version - version)
        seen.update(ages)
        ok = all(age <= max_staleness for age in ages)
        keep.append(ok)
        rollouts_in += len(ages)
        if ok:
            rollouts_out += len(ages)
        else:
            dropped += 1
    return StalenessReport(keep, rollouts_in, rollouts_out, dropped, rollouts_in - rollouts_out, dict(seen))


__all__ = ["StalenessReport", "check_max_staleness", "first_allowed_version", "staleness_filter"]
