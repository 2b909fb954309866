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


def row_settings(records: list[dict[str, Any] | None] | None) -> str | None:
    """The settings key of one task row (its rollouts' records; a row is one agent's, so they agree)."""
    keys = {settings_key(r) for r in records or []} - {None}
    if len(keys) > 1:
        raise ValueError(f"one task row mixes log-prob settings {sorted(keys)}; the rollout data is corrupt.")
    return next(iter(keys), None)


def dataset_logprob_convention(ds: Any) -> dict[str, Any] | None:
    """The one log-prob setting of rollout dataset ``ds`` (its ``logprob_settings`` column), with ``agents``: the
    distinct agent hashes. ``None`` when nothing is recorded. Raises ``ValueError`` for mixed settings."""
    if "logprob_settings" not in getattr(ds, "column_names", ()):
        return None
    keys: dict[str, set[str]] = {}
    for records in ds["logprob_settings"]:
        key = row_settings(records)
        if key is not None:
            keys.setdefault(key, set()).update(r["agent"] for r in records if r and r.get("agent"))
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
    """``ds`` (a rollout dataset) split by log-prob setting: ``{settings key: the rows made with it}``, in first-seen
    order; rows without a record go under ``None``."""
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


def recorded_temperature(
    convention: dict[str, Any] | None = None, per_row: Any = None, where: str = "the batch"
) -> float | None:
    """The temperature the stored log-probs are at: from ``per_row`` (the collator's ``logprob_temperature``
    tensor, NaN where unrecorded) or ``convention``; ``None`` when neither records one. Raises ``ValueError`` when
    ``per_row`` holds two temperatures (a batch of mixed settings)."""
    if per_row is not None:
        import torch

        values = per_row[torch.isfinite(per_row)].unique().tolist()
        if len(values) > 1:
            raise ValueError(
                f"{where} mixes log-probs made at temperatures {values}; prepare each setting on its own "
                "(hf_rollouts.training.split_by_logprob_settings)."
            )
        if values:
            return _exact(float(values[0]))
    if convention and convention.get("temperature") is not None:
        return float(convention["temperature"])
    return None
