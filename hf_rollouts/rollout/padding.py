"""Per-task padding of finished episodes into the rollout columns of :data:`hf_rollouts.schema.ROLLOUT_COLUMNS`."""

from __future__ import annotations

from ..schema import PAD_TOKEN, ROLLOUT_COLUMNS
from ..types import Episode


def pad_task(episodes: list[Episode], pad_token_id: int) -> dict[str, list]:
    """Right-pad one task's rollouts to the longest of them.

    Ids are padded with ``pad_token_id``; masks, rewards and log-probabilities with 0 (each column's ``pad``). An
    episode without log-probabilities keeps ``None``. Returns one list per column of
    :data:`~hf_rollouts.schema.ROLLOUT_COLUMNS` (each column reads the :class:`~hf_rollouts.types.Episode` field
    named by its ``source``), each with ``len(episodes)`` entries.
    """
    if not episodes:
        raise ValueError("pad_task needs at least one episode.")
    width = max(len(e.full_token_ids) for e in episodes)
    out: dict[str, list] = {}
    for column in ROLLOUT_COLUMNS:
        values = [getattr(e, column.source) for e in episodes]
        if not column.is_sequence:
            out[column.name] = values
            continue
        pad = pad_token_id if column.pad == PAD_TOKEN else column.pad
        out[column.name] = [None if v is None else list(v) + [pad] * (width - len(v)) for v in values]
    return out


def pad_groups(episodes: list[Episode], num_rollouts: int, pad_token_id: int) -> list[dict[str, list]]:
    """Split task-major ``episodes`` into groups of ``num_rollouts`` and pad each group (:func:`pad_task`)."""
    return [pad_task(episodes[i : i + num_rollouts], pad_token_id) for i in range(0, len(episodes), num_rollouts)]
