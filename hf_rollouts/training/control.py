"""The control run of a learning experiment: the same updates, with the rewards' link to the rollouts cut."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any


def shuffle_advantages(dataset: Any, seed: int) -> Any:
    """``dataset`` (flattened rows of :func:`~.data.prepare_rollouts`, with ``group_id`` and ``advantage``) with each
    group's advantages permuted among its rollouts by a ``random.Random(seed)``.

    A group's advantages keep their values, mean and spread, so a control run takes updates of the same size as the
    real one; only which rollout gets which advantage is random, so the updates no longer follow the reward. With
    GRPO's group-normalised advantages this is the same as shuffling the rewards within each group.

    A rollout of several samples (several rows with one ``rollout_index``) keeps one advantage on all of them. An
    empty round (every group dropped: ``prepare_rollouts`` keeps the columns) comes back as it is.
    """
    missing = [c for c in ("group_id", "advantage") if c not in getattr(dataset, "column_names", ())]
    if missing:
        raise ValueError(
            f"shuffle_advantages needs the columns {missing}: give it flattened rows, "
            "prepare_rollouts(rollouts, flatten=True).dataset."
        )
    if not len(dataset):
        return dataset
    rng = random.Random(seed)
    # a rollout of several samples is several rows (one per sample): its advantage moves as one
    rollouts = dataset["rollout_index"] if "rollout_index" in dataset.column_names else range(len(dataset))
    groups: dict[Any, dict[Any, list[int]]] = defaultdict(dict)
    for i, (g, k) in enumerate(zip(dataset["group_id"], rollouts)):
        groups[g].setdefault(k, []).append(i)
    advantages = list(dataset["advantage"])
    shuffled = list(advantages)
    for members in groups.values():
        rows = list(members.values())
        values = [advantages[r[0]] for r in rows]
        rng.shuffle(values)
        for r, v in zip(rows, values):
            for i in r:
                shuffled[i] = v
    return dataset.map(lambda row, i: {"advantage": shuffled[i]}, with_indices=True)
