"""Which log-probabilities a rollout dataset stores, and the checks that keep a ratio honest.

Every rollout records how its log-probs were made in the ``logprob_settings`` column
(:data:`hf_rollouts.schema.LOGPROB_SETTINGS`: kind, temperature, top-p, top-k, the agent's fingerprint hash), for
hf_rollouts' own agents (``log_softmax(logits / T)`` at the sampling temperature ``T``) and for inference servers
alike. A server may store another quantity: vLLM returns ``log_softmax(logits)`` (raw, before temperature) unless
started with ``--logprobs-mode processed_logprobs``; that is recorded as ``{"kind": "raw", "temperature": 1.0}``.
Datasets written before the column existed may carry the record in their card's YAML metadata
(:data:`hf_rollouts.schema.LOGPROB_CONVENTION_KEY`), read as a fallback.

A PPO/GRPO ratio ``exp(new - old)`` is only meaningful when ``new`` is computed the same way as ``old``:
:func:`~.loss.token_logprobs` recomputes at the recorded temperature unless told otherwise, and
:func:`check_logprob_convention` refuses another one with a line that says how to fix it. A dataset whose rows were
made with different settings (two runs concatenated) is refused by :func:`~.data.prepare_rollouts`;
:func:`split_by_logprob_settings` splits it into one dataset per setting. Rows from several versions of one policy
(the agent hash differs, the settings do not) are fine: each stored log-prob is its own sample's.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from ..schema import LOGPROB_CONVENTION_KEY

SETTING_KEYS = ("kind", "temperature", "top_p", "top_k")
"""The fields of a log-prob record that must agree across a training set (the agent hash may differ)."""


def settings_key(record: dict[str, Any] | None) -> str | None:
    """The part of a ``logprob_settings`` record that must be uniform, as a canonical string (``None``: no record)."""
    if not record:
        return None
    return json.dumps({k: _exact(record.get(k)) for k in SETTING_KEYS}, sort_keys=True)


def _exact(value: Any) -> Any:
    """A float32-stored setting as written (0.699999988 -> 0.7): six significant digits."""
    return float(f"{value:.6g}") if isinstance(value, float) else value


def _records(value: dict[str, Any] | list[dict[str, Any] | None] | None) -> list[dict[str, Any] | None]:
    """A row's ``logprob_settings`` as a list: a task row holds one record per rollout, a flattened row one."""
    return [value] if isinstance(value, dict) else list(value or [])


def row_settings(records: dict[str, Any] | list[dict[str, Any] | None] | None) -> str | None:
    """The settings key of one row: a task row's (its rollouts' records; a row is one agent's, so they agree) or a
    flattened row's (its one record)."""
    keys = {settings_key(r) for r in _records(records)} - {None}
    if len(keys) > 1:
        raise ValueError(f"one task row mixes log-prob settings {sorted(keys)}; the rollout data is corrupt.")
    return next(iter(keys), None)


def dataset_logprob_convention(ds: Any) -> dict[str, Any] | None:
    """The one log-prob setting of ``ds`` (its ``logprob_settings`` column; task rows or flattened rows), with
    ``agents``: the distinct agent hashes. ``None`` when nothing is recorded. Raises ``ValueError`` for mixed
    settings: the whole dataset is read, so the answer never depends on where batches fall."""
    if "logprob_settings" not in getattr(ds, "column_names", ()):
        return None
    keys: dict[str, set[str]] = {}
    for records in ds["logprob_settings"]:
        key = row_settings(records)
        if key is not None:
            keys.setdefault(key, set()).update(r["agent"] for r in _records(records) if r and r.get("agent"))
    if len(keys) > 1:
        described = "; ".join(sorted(keys))
        raise ValueError(
            f"the rollouts mix log-prob settings ({described}): two runs concatenated? A ratio needs one setting; "
            "split them with hf_rollouts.training.split_by_logprob_settings(dataset) and prepare each part on its own."
        )
    if not keys:
        return None
    ((key, agents),) = keys.items()
    return {**json.loads(key), "agents": sorted(agents)}


def split_by_logprob_settings(ds: Any) -> dict[str | None, Any]:
    """``ds`` (a rollout dataset, task rows or flattened rows) split by log-prob setting: ``{settings key: the rows
    made with it}``, in first-seen order; rows without a record go under ``None``."""
    if "logprob_settings" not in ds.column_names:
        return {None: ds}
    groups: dict[str | None, list[int]] = {}
    for i, records in enumerate(ds["logprob_settings"]):
        groups.setdefault(row_settings(records), []).append(i)
    return {key: ds.select(rows) for key, rows in groups.items()}


def read_logprob_convention(source: Any) -> dict[str, Any] | None:
    """The log-prob convention of ``source``: a rollout ``Dataset`` (its ``logprob_settings`` column), a
    ``save_rollouts`` directory or a Hub dataset id (the column, else the card's YAML record).

    ``None`` when nothing is recorded (an agent that records none, or a dataset older than the column and card).
    Raises ``ValueError`` when the rows mix settings (see :func:`dataset_logprob_convention`).
    """
    if hasattr(source, "column_names"):
        return dataset_logprob_convention(source)
    if not isinstance(source, (str, Path)):
        return None
    from huggingface_hub import DatasetCard

    path = Path(source)
    readme = path / "README.md" if path.is_dir() else None
    try:
        if readme is not None:
            card = DatasetCard.load(readme) if readme.is_file() else None
        else:
            card = DatasetCard.load(str(source)) if str(source).count("/") == 1 and not path.exists() else None
    except Exception:  # no card reachable (offline, no README): nothing recorded
        return None
    value = card.data.to_dict().get(LOGPROB_CONVENTION_KEY) if card is not None else None
    return value if isinstance(value, dict) else None


def check_logprob_convention(convention: dict[str, Any] | None, temperature: float) -> None:
    """Raise ``ValueError`` if log-probs recomputed at ``temperature`` would not match the stored ones.

    ``convention`` is what :func:`read_logprob_convention` returns (``None``: nothing recorded,
    nothing checked). ``temperature == 0`` (greedy) means unscaled logits, as in the agents.
    """
    if not convention:
        return
    stored = float(convention.get("temperature", 1.0))
    used = temperature if temperature > 0 else 1.0
    if abs(stored - used) > 1e-6:
        kind = convention.get("kind", "?")
        raise ValueError(
            f"The stored log-probs are log_softmax(logits / {stored:g}) ({kind!r}), but they would be compared with "
            f"log-probs recomputed at temperature={temperature:g}, which biases the ratio: leave temperature unset "
            f"(the recorded {stored:g} is used) or pass temperature={stored:g}"
            + (
                ", or regenerate with processed log-probs (vLLM: --logprobs-mode processed_logprobs)."
                if kind == "raw"
                else "."
            )
        )


def row_temperatures(
    temperature: float | None, rows: int, convention: dict[str, Any] | None = None, per_row: Any = None
) -> list[float]:
    """The temperature to recompute each of ``rows`` rows at (``0``: greedy, unscaled logits).

    Each row's record comes from ``per_row`` (the collator's ``logprob_temperature`` ``[rows]`` tensor, NaN where
    unrecorded), else from ``convention``. ``temperature`` given: every row at it, after
    :func:`check_logprob_convention` against each recorded one (``ValueError`` on a mismatch). ``None``: each row
    at its own record, so a batch of rows from two settings is handled row by row whatever batch it falls in; rows
    with no record at 1.0, with a warning saying so (pass ``temperature=`` to say which).
    """
    if temperature is not None and temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}.")
    fallback = convention.get("temperature") if convention else None
    recorded: list[float | None] = [None] * rows
    if per_row is not None:
        values = per_row.tolist() if hasattr(per_row, "tolist") else list(per_row)
        if len(values) != rows:
            raise ValueError(f"recorded_temperature has {len(values)} entries for {rows} rows.")
        recorded = [_exact(float(v)) if v == v else None for v in values]  # v != v: NaN, not recorded
    recorded = [fallback if r is None else r for r in recorded]
    if temperature is not None:
        for stored in sorted({float(r) for r in recorded if r is not None}):
            check_logprob_convention({**(convention or {}), "temperature": stored}, temperature)
        return [float(temperature)] * rows
    unknown = sum(r is None for r in recorded)
    if unknown:
        warnings.warn(
            "token_logprobs: rows that record no sampling temperature (no logprob_settings, no convention) are "
            "computed at temperature 1.0, right only for rollouts sampled at 1.0; "
            "pass temperature= the one they were sampled at (1.0 to keep this and silence the warning).",
            UserWarning,
            stacklevel=3,
        )
    return [1.0 if r is None else float(r) for r in recorded]
