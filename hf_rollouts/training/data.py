"""Reading rollout datasets for training: score each group, drop what must not be trained on, flatten.

See :mod:`hf_rollouts.training` for the conventions (positions, advantages, errors).

**Samples.** A rollout of one or more samples (:class:`hf_rollouts.sample.Sample`; the ``earlier_*`` columns hold
every sample but the last, the ``padded_*`` columns the last) flattens to one row per sample, earlier samples
first, each with its rollout's advantage (computed per group from ``final_rewards``, as for any rollout). A dataset
without the samples' columns (written before them) has one sample per rollout.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from datasets import Dataset, DatasetDict, Features, List, Value

from ..schema import LOGPROB_SETTINGS, ROLLOUT_FEATURES, SAMPLE_COLUMNS, require_columns
from ..sources import load_dataset_source
from .advantages import RolloutFilter, RolloutFilterReport, drop_reasons, filter_report, group_advantages
from .convention import dataset_logprob_convention, read_logprob_convention

PER_ROLLOUT_COLUMNS: tuple[str, ...] = tuple(ROLLOUT_FEATURES)
"""The schema's columns holding one entry per rollout (outer length ``num_rollouts``). ``prepare_rollouts(
flatten=False)`` filters these and every other list column whose length in a row equals that row's number of
rollouts (``len(final_rewards)``): rescoring's ``previous_*`` and ``rescored``, a user's per-rollout column."""

ADDED_COLUMNS = ("advantages", "rollout_indices", "advantage_mode")
"""The columns ``prepare_rollouts(flatten=False)`` adds (an input's own are replaced)."""

FLAT_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "attention_mask": List(Value("int8")),
        "agent_mask": List(Value("int8")),
        "sampled_mask": List(Value("int8")),
        "per_token_rewards": List(Value("float32")),
        "old_logprobs": List(Value("float32")),
        "final_reward": Value("float32"),
        "advantage": Value("float32"),
        "advantage_mode": Value("string"),
        "status": Value("string"),
        "num_turns": Value("int32"),
        "group_id": Value("int64"),
        "rollout_index": Value("int32"),
        "logprob_settings": LOGPROB_SETTINGS,
        "sample_index": Value("int32"),
    }
)
"""One row per rollout, trimmed to the rollout's real length (no per-task
padding). ``agent_mask`` is the loss mask before the collator's extra exclusions;
``sampled_mask`` marks agent tokens the agent reported as sampled (``None`` when
the source has no ``padded_sampled_token_mask`` column); ``old_logprobs`` is ``None`` for a rollout
whose agent gave no log-probabilities
and NaN on agent tokens of turns without them; ``group_id`` is the task row's
index in the loaded dataset and ``rollout_index`` the rollout's index in it; ``logprob_settings`` is how the
rollout's log-probs were made (:data:`hf_rollouts.schema.LOGPROB_SETTINGS`, ``None`` when not recorded).
``sample_index``: which sample of its rollout the row is (0 for a rollout of one sample; the last sample is
``num_samples - 1``); every sample of a rollout is a row with the rollout's ``advantage``, ``final_reward``, ``status``
and ``num_turns`` (all its turns)."""


@dataclass(frozen=True)
class PreparedRollouts:
    """What :func:`prepare_rollouts` returns: the training dataset and its filter report."""

    dataset: Dataset
    report: RolloutFilterReport
    logprob_convention: dict[str, Any] | None = None
    """How the stored log-probs were made (kind, temperature, top_p, top_k, ``agents``: the agent hashes), from the
    ``logprob_settings`` column or, for older datasets, the card (see :mod:`.convention`); ``None`` when not
    recorded. The flattened rows and the collator's ``logprob_temperature`` carry it too, so
    :func:`~.loss.token_logprobs` recomputes at the recorded temperature."""


def _real_length(attention: Sequence[int], where: str) -> int:
    n = sum(1 for a in attention if a)
    if any(attention[n:]) or not all(attention[:n]):
        raise ValueError(f"{where}: attention mask is not 1s followed by right padding 0s; cannot trim it.")
    return n


def _samples(batch: dict[str, list], row: int, k: int, n: int) -> list[tuple[Any, ...]]:
    """Rollout ``k`` of task row ``row`` as its samples ``(ids, attention, agent, sampled, rewards, logprobs)``: the
    earlier samples (``earlier_*`` columns, where the dataset has them), then the padded last one trimmed to ``n``."""
    out = []
    if all(c in batch for c in SAMPLE_COLUMNS) and batch["earlier_token_ids"][row][k]:
        earlier = [batch[c][row][k] for c in SAMPLE_COLUMNS]
        for ids, agent, sampled, rewards, logprobs in zip(*earlier):
            out.append((ids, [1] * len(ids), agent, sampled, rewards, logprobs))
    sampled = batch["padded_sampled_token_mask"][row][k] if "padded_sampled_token_mask" in batch else None
    logprobs = batch["padded_logprobs"][row][k]
    out.append(
        (
            batch["padded_full_token_ids"][row][k][:n],
            batch["padded_full_attention_mask"][row][k][:n],
            batch["padded_agent_token_mask"][row][k][:n],
            None if sampled is None else sampled[:n],
            batch["padded_per_token_rewards"][row][k][:n],
            None if logprobs is None else logprobs[:n],
        )
    )
    return out


def _flatten_batch(
    batch: dict[str, list], indices: list[int], *, opts: RolloutFilter, group_ids: list[int]
) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in FLAT_FEATURES}
    for row, idx in enumerate(indices):
        rewards, statuses = batch["final_rewards"][row], batch["statuses"][row]
        advantages = group_advantages(rewards, statuses, opts.advantage, opts.eps)
        reasons = drop_reasons(rewards, statuses, opts)
        turns = batch["num_turns"][row] if "num_turns" in batch else [None] * len(rewards)
        settings = batch["logprob_settings"][row] if "logprob_settings" in batch else None
        for k, reason in enumerate(reasons):
            if reason:
                continue
            n = _real_length(batch["padded_full_attention_mask"][row][k], f"group {group_ids[idx]}, rollout {k}")
            for j, (ids, attention, agent, sampled, token_rewards, logprobs) in enumerate(_samples(batch, row, k, n)):
                out["input_ids"].append(ids)
                out["attention_mask"].append(attention)
                out["agent_mask"].append(agent)
                out["sampled_mask"].append(sampled)
                out["per_token_rewards"].append(token_rewards)
                out["old_logprobs"].append(logprobs)
                out["final_reward"].append(math.nan if rewards[k] is None else rewards[k])
                out["advantage"].append(advantages[k])  # the episode's, on every one of its samples
                out["advantage_mode"].append(opts.advantage)
                out["status"].append(statuses[k])
                out["num_turns"].append(turns[k])
                out["group_id"].append(group_ids[idx])
                out["rollout_index"].append(k)
                out["logprob_settings"].append(settings[k] if settings else None)
                out["sample_index"].append(j)
    return out


def _filter_groups_batch(batch: dict[str, list], *, opts: RolloutFilter) -> dict[str, list]:
    out: dict[str, list] = {c: [] for c in ADDED_COLUMNS}
    listed = [c for c in batch if c not in ADDED_COLUMNS]
    for c in listed:
        out[c] = []
    for row in range(len(batch["final_rewards"])):
        rewards, statuses = batch["final_rewards"][row], batch["statuses"][row]
        advantages = group_advantages(rewards, statuses, opts.advantage, opts.eps)
        keep = [k for k, reason in enumerate(drop_reasons(rewards, statuses, opts)) if not reason]
        for c in listed:  # a per-rollout column (see PER_ROLLOUT_COLUMNS) loses the dropped rollouts
            value = batch[c][row]
            per_rollout = c in PER_ROLLOUT_COLUMNS or (isinstance(value, list) and len(value) == len(rewards))
            out[c].append([value[k] for k in keep] if per_rollout and value is not None else value)
        out["advantages"].append([advantages[k] for k in keep])
        out["rollout_indices"].append(keep)
        out["advantage_mode"].append(opts.advantage)
    return out


def prepare_rollouts(
    source: str | Path | Dataset | DatasetDict,
    *,
    flatten: bool = False,
    split: str = "train",
    batch_size: int = 256,
    progress: bool = True,
    **filter_options: Any,
) -> PreparedRollouts:
    """Load rollouts, score each rollout within its group, drop what must not be trained on.

    Args:
        source: a ``save_to_disk`` directory (what :func:`hf_rollouts.publish.save_rollouts`
            writes), a directory of parquet files, a parquet file or glob, a Hub dataset id
            (``load_dataset(source, split=split)``), or a ``Dataset``/``DatasetDict`` in memory
            (see :func:`hf_rollouts.sources.load_dataset_source`).
        flatten: ``True``: one row per sample of each kept rollout (one per rollout for append-only episodes)
            with :data:`FLAT_FEATURES`, trimmed to its real length (what :class:`~.collate.RolloutCollator` takes);
            every sample of a rollout carries the rollout's advantage.
            ``False``: the task rows, with every per-rollout list column (:data:`PER_ROLLOUT_COLUMNS`, and any
            other list column whose length in a row is the row's number of rollouts, ``len(final_rewards)``:
            rescoring's ``previous_*``, a user's column; a per-task list column of that length would be filtered
            too) reduced to the kept rollouts (sequences
            stay padded to the task's original width) plus ``advantages``,
            ``rollout_indices`` and ``advantage_mode``; rows left with no rollout are removed.
        split: the split to read from a Hub id or a ``DatasetDict``.
        batch_size: task rows per ``Dataset.map`` batch.
        progress: show ``Dataset.map``'s progress bar (``False`` in a training loop: one bar a round is noise).
        **filter_options: the fields of :class:`~.advantages.RolloutFilter` (``drop_errors``,
            ``keep_truncated``, ``drop_constant_groups``, ``advantage``, ``eps``), with its
            defaults. Advantages are computed before anything is dropped.

    Returns:
        :class:`PreparedRollouts` ``(dataset, report, logprob_convention)``. The report is computed
        from the scalar columns, so it is right even when ``Dataset.map`` serves
        the token data from its cache. A round where nothing is kept (every group dropped: all its rewards equal)
        is an empty dataset with every column, which the collator, :func:`~.control.shuffle_advantages` and
        :func:`~.loop.grpo_update` take as an empty step; ``report.nothing_to_learn`` says so.

    Raises:
        ValueError: when the rows' log-probs were made with different settings (two runs concatenated; see
            :func:`~.convention.split_by_logprob_settings`), or when the dataset lacks some of the earlier
            samples' columns (:data:`~hf_rollouts.schema.SAMPLE_COLUMNS`) but holds rollouts of several samples
            (:func:`check_sample_columns`), before any work.
    """
    unknown = sorted(set(filter_options) - {f.name for f in fields(RolloutFilter)})
    if unknown:
        raise TypeError(
            f"prepare_rollouts got unknown option(s) {unknown}; the filter options are the fields of RolloutFilter."
        )
    opts = RolloutFilter(**filter_options)
    ds = load_dataset_source(source, split)
    require_columns(ds)
    check_sample_columns(ds)
    convention = dataset_logprob_convention(ds) or read_logprob_convention(source)
    scalars = ds.select_columns(["final_rewards", "statuses"]).to_dict()
    report, kept_groups = filter_report(scalars["final_rewards"], scalars["statuses"], opts)
    kept = ds.select(kept_groups) if len(kept_groups) != len(ds) else ds
    with _progress_bars(progress):
        out = _prepare(kept, flatten, batch_size, opts, kept_groups)
    return PreparedRollouts(out, report, convention)


def check_sample_columns(ds: Dataset) -> None:
    """Raise ``ValueError`` naming the missing columns when ``ds`` lacks some of the earlier samples' columns
    (:data:`~hf_rollouts.schema.SAMPLE_COLUMNS`; a ``select_columns`` that left them out) while a rollout has
    several samples (``num_samples > 1``, or earlier samples in ``earlier_token_ids``; with neither column, any
    partial set of them): training would otherwise see only the last sample of each rollout. A dataset with none
    of them and no ``num_samples`` (written before samples) has one sample per rollout."""
    missing = [c for c in SAMPLE_COLUMNS if c not in ds.column_names]
    if not missing:
        return
    evidence = next((c for c in ("num_samples", "earlier_token_ids") if c in ds.column_names), None)
    where = ""
    if evidence is not None:
        values = ds.select_columns([evidence]).to_dict()[evidence]
        several = (lambda n: (n or 1) > 1) if evidence == "num_samples" else bool
        row = next((i for i, per in enumerate(values) if any(several(v) for v in per or [])), None)
        if row is None:
            return
        where = f" row {row} has a rollout of several samples ({evidence}), and"
    elif len(missing) == len(SAMPLE_COLUMNS):
        return
    raise ValueError(
        f"the rollout dataset lacks the earlier samples' column(s) {missing}:{where} without them training would "
        "see only the last sample of each rollout. Keep every earlier_* column (hf_rollouts.schema.SAMPLE_COLUMNS) "
        "with the padded_* ones when selecting columns."
    )


def _prepare(kept: Dataset, flatten: bool, batch_size: int, opts: RolloutFilter, kept_groups: list[int]) -> Dataset:
    if not len(kept):  # an empty round (every group dropped): no rows, every column (``map`` of nothing keeps none)
        features = FLAT_FEATURES if flatten else _filtered_features(kept)
        return Dataset.from_dict({name: [] for name in features}, features=features)
    if flatten:
        out = kept.map(
            _flatten_batch,
            batched=True,
            batch_size=batch_size,
            with_indices=True,
            remove_columns=kept.column_names,
            features=FLAT_FEATURES,
            fn_kwargs={"opts": opts, "group_ids": kept_groups},
            desc="flatten rollouts",
        )
    else:
        out = kept.map(
            _filter_groups_batch,
            batched=True,
            batch_size=batch_size,
            features=_filtered_features(kept),
            fn_kwargs={"opts": opts},
            desc="filter rollouts",
        )
    return out


def _filtered_features(kept: Dataset) -> Features:
    """The columns of ``prepare_rollouts(flatten=False)``: the task rows' and the three it adds."""
    return Features(
        {
            **kept.features,
            "advantages": List(Value("float32")),
            "rollout_indices": List(Value("int32")),
            "advantage_mode": Value("string"),
        }
    )


@contextlib.contextmanager
def _progress_bars(show: bool):
    """``datasets``' progress bars off for the block when ``show`` is False (and as they were after it)."""
    from datasets.utils import disable_progress_bars, enable_progress_bars, is_progress_bar_enabled

    was = is_progress_bar_enabled()
    if not show and was:
        disable_progress_bars()
    try:
        yield
    finally:
        if not show and was:
            enable_progress_bars()


def load_rollouts(source: str | Path | Dataset | DatasetDict, **options: Any) -> Dataset:
    """:func:`prepare_rollouts` without the report: just the dataset (same arguments). Use
    :func:`prepare_rollouts` when you need to know what was dropped."""
    return prepare_rollouts(source, **options).dataset
