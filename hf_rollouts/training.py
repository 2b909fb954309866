"""From a rollout dataset to GRPO/PPO training batches and a loss.

Three pieces, usable separately:

* :func:`prepare_rollouts` / :func:`load_rollouts` read a rollout dataset (a
  ``save_to_disk`` directory, parquet files, a Hub id or a ``Dataset``), compute
  one advantage per rollout *within its group* (a task row is a group), drop
  what must not be trained on, and optionally flatten to one row per rollout.
  :func:`prepare_rollouts` also returns a :class:`RolloutFilterReport` that
  counts every dropped rollout by reason.
* :class:`RolloutCollator` pads flattened rows into tensors for a
  ``torch.utils.data.DataLoader`` (and ``accelerate``'s prepared loaders).
* :func:`token_logprobs` recomputes per-token log-probabilities with a model and
  :func:`grpo_loss` is the clipped policy-gradient objective with an optional
  KL penalty.

Position convention, shared with the rollout data: position ``t`` of a sequence
holds ``log p(input_ids[t] | input_ids[:t])`` computed as
``log_softmax(logits / temperature)`` (the agent's convention, see
:mod:`hf_rollouts.agents.hf`); position 0 has no prediction and holds 0. The
stored ``padded_logprobs`` and :func:`token_logprobs` both follow it, so their
difference is the log importance ratio with no shifting by the caller.

Advantage modes (:data:`ADVANTAGE_MODES`), computed per group over the group's
non-error rollouts and *before* anything is dropped:

* ``"grpo"``: ``(r - mean) / (std + eps)`` with the population standard
  deviation (``sqrt(mean((r - mean)**2))``, i.e. ``ddof=0``);
* ``"mean_baseline"``: ``r - mean``;
* ``"per_token"``: no scalar advantage (the column holds NaN); the collator uses
  the rollout's raw per-token rewards as per-token advantages.

Error rollouts (status ``"error"`` or a non-finite final reward) never enter the
group statistics and have a NaN advantage. They are dropped by default; kept
(``drop_errors=False``) they stay visible in the data but the collator gives
them an all-zero loss mask, so they are never trained on as a zero reward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from datasets import Dataset, DatasetDict, Features, List, Value, load_dataset, load_from_disk

from .pipeline import ROLLOUT_FEATURES

AdvantageMode = Literal["grpo", "mean_baseline", "per_token"]
ADVANTAGE_MODES: tuple[str, ...] = ("grpo", "mean_baseline", "per_token")

DROP_REASONS: tuple[str, ...] = ("error", "truncated", "constant_group")
"""Why a rollout is dropped, in precedence order: a rollout that is both an error
and in a constant group is counted once, as ``"error"``."""

PER_ROLLOUT_COLUMNS: tuple[str, ...] = tuple(ROLLOUT_FEATURES)
"""Columns holding one entry per rollout (outer length ``num_rollouts``)."""

REQUIRED_COLUMNS: tuple[str, ...] = (
    "padded_full_token_ids",
    "padded_full_attention_mask",
    "padded_agent_token_mask",
    "padded_per_token_rewards",
    "padded_logprobs",
    "final_rewards",
    "statuses",
)

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
    }
)
"""One row per rollout, trimmed to the rollout's real length (no per-task
padding). ``agent_mask`` is the loss mask before the collator's extra exclusions;
``sampled_mask`` marks agent tokens the agent reported as sampled (``None`` when
the source has no ``padded_sampled_token_mask`` column); ``old_logprobs`` is ``None`` for a rollout whose agent gave no log-probabilities
and NaN on agent tokens of turns without them; ``group_id`` is the task row's
index in the loaded dataset and ``rollout_index`` the rollout's index in it."""


# --------------------------------------------------------------------------- options and report


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

    def __str__(self) -> str:
        return (
            f"{self.rollouts_out}/{self.rollouts_in} rollouts kept in {self.groups_out}/{self.groups_in} groups; "
            f"dropped: {self.errors_dropped} error (of {self.errors}), {self.truncated_dropped} truncated "
            f"(of {self.truncated}), {self.constant_group_rollouts_dropped} in {self.constant_groups_dropped} "
            f"constant groups (of {self.constant_groups})"
        )


@dataclass(frozen=True)
class PreparedRollouts:
    """What :func:`prepare_rollouts` returns: the training dataset and its filter report."""

    dataset: Dataset
    report: RolloutFilterReport


# --------------------------------------------------------------------------- per-group plan


def _is_error(status: str, reward: float | None) -> bool:
    return status == "error" or reward is None or not math.isfinite(reward)


def group_advantages(final_rewards: Sequence[float | None], statuses: Sequence[str], mode: str, eps: float = 1e-6) -> list[float]:
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


def _drop_reasons(final_rewards: Sequence[float | None], statuses: Sequence[str], opts: RolloutFilter) -> list[str]:
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


def _report(final_rewards: Sequence[Sequence[float | None]], statuses: Sequence[Sequence[str]], opts: RolloutFilter) -> tuple[RolloutFilterReport, list[int]]:
    counts = dict.fromkeys(RolloutFilterReport.__dataclass_fields__, 0)
    kept_groups = []
    for g, (rewards, stats) in enumerate(zip(final_rewards, statuses)):
        if len(rewards) != len(stats):
            raise ValueError(f"row {g}: {len(rewards)} final_rewards but {len(stats)} statuses; the rollout data is corrupt.")
        reasons = _drop_reasons(rewards, stats, opts)
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


# --------------------------------------------------------------------------- loading


def _read(source: str | Path | Dataset | DatasetDict, split: str) -> Dataset:
    """A ``Dataset`` from any of the places rollouts are kept (see :func:`prepare_rollouts`)."""
    if isinstance(source, DatasetDict):
        return _pick_split(source, split, "the DatasetDict")
    if isinstance(source, Dataset):
        return source
    text = str(source)
    path = Path(text)
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            loaded = load_from_disk(text)
            return _pick_split(loaded, split, text) if isinstance(loaded, DatasetDict) else loaded
        files = sorted(path.glob("*.parquet")) or sorted((path / "parquet").glob("*.parquet"))
        if not files:
            raise FileNotFoundError(
                f"{text} is a directory but holds neither a save_to_disk dataset (state.json) nor parquet files "
                "(*.parquet or parquet/*.parquet). Point at the directory hf_rollouts.publish.save_rollouts wrote."
            )
        return load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    if text.endswith(".parquet") or any(c in text for c in "*?["):
        return load_dataset("parquet", data_files=text, split="train")
    if path.exists():
        raise ValueError(f"{text} is a file but not parquet; give a save_to_disk directory, parquet file(s) or a Hub dataset id.")
    if text.startswith(("/", ".", "~")) or text.count("/") > 1:
        raise FileNotFoundError(f"{text} does not exist (and is not a Hub dataset id 'owner/name').")
    return load_dataset(text, split=split)  # a Hub dataset id


def _pick_split(dd: DatasetDict, split: str, where: str) -> Dataset:
    if split not in dd:
        raise KeyError(f"{where} has no split {split!r}; it has {list(dd)}. Pass split=...")
    return dd[split]


def _check_columns(ds: Dataset) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"not a rollout dataset: missing column(s) {missing} (it has {ds.column_names}). "
            "Rollout datasets come from hf_rollouts.pipeline.generate_rollouts (schema: hf_rollouts.pipeline.ROLLOUT_FEATURES); "
            "an already flattened dataset needs no prepare_rollouts."
        )


def _real_length(attention: Sequence[int], where: str) -> int:
    n = sum(1 for a in attention if a)
    if any(attention[n:]) or not all(attention[:n]):
        raise ValueError(f"{where}: attention mask is not 1s followed by right padding 0s; cannot trim it.")
    return n


def _flatten_batch(batch: dict[str, list], indices: list[int], *, opts: RolloutFilter, group_ids: list[int]) -> dict[str, list]:
    out: dict[str, list] = {k: [] for k in FLAT_FEATURES}
    for row, idx in enumerate(indices):
        rewards, statuses = batch["final_rewards"][row], batch["statuses"][row]
        advantages = group_advantages(rewards, statuses, opts.advantage, opts.eps)
        reasons = _drop_reasons(rewards, statuses, opts)
        turns = batch["num_turns"][row] if "num_turns" in batch else [None] * len(rewards)
        for k, reason in enumerate(reasons):
            if reason:
                continue
            n = _real_length(batch["padded_full_attention_mask"][row][k], f"group {group_ids[idx]}, rollout {k}")
            logprobs = batch["padded_logprobs"][row][k]
            out["input_ids"].append(batch["padded_full_token_ids"][row][k][:n])
            out["attention_mask"].append(batch["padded_full_attention_mask"][row][k][:n])
            out["agent_mask"].append(batch["padded_agent_token_mask"][row][k][:n])
            sampled = batch["padded_sampled_token_mask"][row][k] if "padded_sampled_token_mask" in batch else None
            out["sampled_mask"].append(None if sampled is None else sampled[:n])
            out["per_token_rewards"].append(batch["padded_per_token_rewards"][row][k][:n])
            out["old_logprobs"].append(None if logprobs is None else logprobs[:n])
            out["final_reward"].append(math.nan if rewards[k] is None else rewards[k])
            out["advantage"].append(advantages[k])
            out["advantage_mode"].append(opts.advantage)
            out["status"].append(statuses[k])
            out["num_turns"].append(turns[k])
            out["group_id"].append(group_ids[idx])
            out["rollout_index"].append(k)
    return out


def _filter_groups_batch(batch: dict[str, list], *, opts: RolloutFilter) -> dict[str, list]:
    out: dict[str, list] = {"advantages": [], "rollout_indices": [], "advantage_mode": []}
    per_rollout = [c for c in PER_ROLLOUT_COLUMNS if c in batch]
    for c in per_rollout:
        out[c] = []
    for row in range(len(batch["final_rewards"])):
        rewards, statuses = batch["final_rewards"][row], batch["statuses"][row]
        advantages = group_advantages(rewards, statuses, opts.advantage, opts.eps)
        keep = [k for k, reason in enumerate(_drop_reasons(rewards, statuses, opts)) if not reason]
        for c in per_rollout:
            out[c].append([batch[c][row][k] for k in keep])
        out["advantages"].append([advantages[k] for k in keep])
        out["rollout_indices"].append(keep)
        out["advantage_mode"].append(opts.advantage)
    return out


def prepare_rollouts(
    source: str | Path | Dataset | DatasetDict,
    *,
    flatten: bool = False,
    drop_errors: bool = True,
    keep_truncated: bool = True,
    drop_constant_groups: bool = False,
    advantage: AdvantageMode = "grpo",
    eps: float = 1e-6,
    split: str = "train",
    batch_size: int = 256,
) -> PreparedRollouts:
    """Load rollouts, score each rollout within its group, drop what must not be trained on.

    Args:
        source: a ``save_to_disk`` directory (what :func:`hf_rollouts.publish.save_rollouts`
            writes), a directory of ``*.parquet`` or ``parquet/*.parquet`` files, a
            parquet file or glob, a Hub dataset id (``load_dataset(source, split=split)``),
            or a ``Dataset``/``DatasetDict`` already in memory.
        flatten: ``True``: one row per kept rollout with :data:`FLAT_FEATURES`,
            trimmed to the rollout's real length (what :class:`RolloutCollator` takes).
            ``False``: the task rows, with every per-rollout list column
            (:data:`PER_ROLLOUT_COLUMNS`) reduced to the kept rollouts (sequences
            stay padded to the task's original width) plus ``advantages``,
            ``rollout_indices`` and ``advantage_mode``; rows left with no rollout are removed.
        drop_errors, keep_truncated, drop_constant_groups, advantage, eps: see
            :class:`RolloutFilter`. Advantages are computed before anything is dropped.
        split: the split to read from a Hub id or a ``DatasetDict``.
        batch_size: task rows per ``Dataset.map`` batch.

    Returns:
        :class:`PreparedRollouts` ``(dataset, report)``. The report is computed
        from the scalar columns, so it is right even when ``Dataset.map`` serves
        the token data from its cache.
    """
    opts = RolloutFilter(drop_errors, keep_truncated, drop_constant_groups, advantage, eps)
    ds = _read(source, split)
    _check_columns(ds)
    scalars = ds.select_columns(["final_rewards", "statuses"]).to_dict()
    report, kept_groups = _report(scalars["final_rewards"], scalars["statuses"], opts)
    kept = ds.select(kept_groups) if len(kept_groups) != len(ds) else ds
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
        features = Features(
            {
                **kept.features,
                "advantages": List(Value("float32")),
                "rollout_indices": List(Value("int32")),
                "advantage_mode": Value("string"),
            }
        )
        out = kept.map(
            _filter_groups_batch,
            batched=True,
            batch_size=batch_size,
            features=features,
            fn_kwargs={"opts": opts},
            desc="filter rollouts",
        )
    return PreparedRollouts(out, report)


def load_rollouts(
    source: str | Path | Dataset | DatasetDict,
    *,
    flatten: bool = False,
    drop_errors: bool = True,
    keep_truncated: bool = True,
    drop_constant_groups: bool = False,
    advantage: AdvantageMode = "grpo",
    eps: float = 1e-6,
    split: str = "train",
) -> Dataset:
    """:func:`prepare_rollouts` without the report: just the dataset. Use
    :func:`prepare_rollouts` when you need to know what was dropped."""
    return prepare_rollouts(
        source,
        flatten=flatten,
        drop_errors=drop_errors,
        keep_truncated=keep_truncated,
        drop_constant_groups=drop_constant_groups,
        advantage=advantage,
        eps=eps,
        split=split,
    ).dataset


# --------------------------------------------------------------------------- collation


def _tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(value, dtype=dtype).reshape(-1)


@dataclass
class RolloutCollator:
    """Pads flattened rollout rows (:data:`FLAT_FEATURES`) into a training batch, right padding.

    Returns a dict of tensors, ``[batch, width]`` unless noted:

    * ``input_ids`` (long, ``pad_token_id`` on padding), ``attention_mask`` (long);
    * ``loss_mask`` (float 0/1): agent tokens that can be trained on, i.e.
      ``agent_mask`` and not padding, minus tokens the agent did not sample
      (``sampled_mask`` 0: re-tokenized text), minus tokens whose old
      log-probability is missing or NaN (``missing_logprobs="mask"``), minus every
      token of an error rollout or of a rollout whose advantage is not finite;
    * ``per_token_rewards`` (float, 0 off agent tokens);
    * ``advantages`` (float): the row's scalar ``advantage`` on loss tokens and 0
      elsewhere; in ``"per_token"`` mode the row's per-token rewards on loss tokens;
    * ``old_logprobs`` (float): the stored sampling log-probs, 0 where missing/NaN/padding;
    * ``final_rewards`` (float ``[batch]``, NaN for errors), ``group_ids`` (long ``[batch]``).

    Args:
        pad_token_id: id used for padding ``input_ids``.
        advantage: ``None`` (default) uses each row's ``advantage_mode``;
            ``"per_token"`` always works (it needs only the rewards); ``"grpo"`` /
            ``"mean_baseline"`` must match the mode the rows were prepared with.
        missing_logprobs: ``"mask"`` drops agent tokens without an old log-prob
            (or not sampled by the agent) from the loss; ``"raise"`` refuses such rows.
        pad_to_multiple_of: round the batch width up to a multiple of this.
    """

    pad_token_id: int
    advantage: AdvantageMode | None = None
    missing_logprobs: Literal["mask", "raise"] = "mask"
    pad_to_multiple_of: int | None = None

    def __post_init__(self) -> None:
        if self.advantage is not None and self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be None or one of {ADVANTAGE_MODES}, got {self.advantage!r}.")
        if self.missing_logprobs not in ("mask", "raise"):
            raise ValueError(f"missing_logprobs must be 'mask' or 'raise', got {self.missing_logprobs!r}.")

    def _mode(self, row: Mapping[str, Any]) -> str:
        stored = row.get("advantage_mode")
        if self.advantage is None:
            if stored is None:
                raise ValueError("rows have no 'advantage_mode'; prepare them with prepare_rollouts(flatten=True) or pass advantage=.")
            return stored
        if self.advantage != "per_token" and stored is not None and stored != self.advantage:
            raise ValueError(
                f"RolloutCollator(advantage={self.advantage!r}) but the rows were prepared with advantage={stored!r}; "
                f"prepare them again with prepare_rollouts(..., advantage={self.advantage!r}) or use advantage=None."
            )
        return self.advantage

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not rows:
            raise ValueError("RolloutCollator got an empty batch.")
        missing = [c for c in ("input_ids", "attention_mask", "agent_mask", "per_token_rewards", "old_logprobs") if c not in rows[0]]
        if missing:
            raise ValueError(f"rows lack {missing}; flatten the rollouts first: prepare_rollouts(source, flatten=True).")
        lengths = [len(r["input_ids"]) for r in rows]
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        b = len(rows)
        out = {
            "input_ids": torch.full((b, width), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((b, width), dtype=torch.long),
            "loss_mask": torch.zeros((b, width), dtype=torch.float32),
            "per_token_rewards": torch.zeros((b, width), dtype=torch.float32),
            "advantages": torch.zeros((b, width), dtype=torch.float32),
            "old_logprobs": torch.zeros((b, width), dtype=torch.float32),
            "final_rewards": torch.zeros(b, dtype=torch.float32),
            "group_ids": torch.zeros(b, dtype=torch.long),
        }
        for i, (row, n) in enumerate(zip(rows, lengths)):
            mode = self._mode(row)
            attention = _tensor(row["attention_mask"], torch.long)
            agent = _tensor(row["agent_mask"], torch.bool) & attention.bool()
            sampled = agent if row.get("sampled_mask") is None else agent & _tensor(row["sampled_mask"], torch.bool)
            rewards = _tensor(row["per_token_rewards"], torch.float32)
            if row["old_logprobs"] is None:
                old = torch.full((n,), math.nan)
            else:
                old = _tensor(row["old_logprobs"], torch.float32)
            if self.missing_logprobs == "raise" and bool((agent & ~(sampled & torch.isfinite(old))).any()):
                raise ValueError(
                    f"row {i} (group {row.get('group_id')}, rollout {row.get('rollout_index')}) has agent tokens without "
                    "old log-probabilities or re-tokenized from text (a text-only agent?); use RolloutCollator(missing_logprobs='mask') to skip them."
                )
            status = row.get("status")
            final = row.get("final_reward")
            final = math.nan if final is None else float(final)
            if mode == "per_token":
                valid_row = status != "error" and math.isfinite(final)
                token_adv = torch.nan_to_num(rewards, nan=0.0)
            else:
                scalar = row.get("advantage")
                scalar = math.nan if scalar is None else float(scalar)
                valid_row = status != "error" and math.isfinite(scalar)
                token_adv = torch.full((n,), scalar if valid_row else 0.0)
            loss = sampled & torch.isfinite(old) if valid_row else torch.zeros(n, dtype=torch.bool)
            out["input_ids"][i, :n] = _tensor(row["input_ids"], torch.long)
            out["attention_mask"][i, :n] = attention
            out["loss_mask"][i, :n] = loss.float()
            out["per_token_rewards"][i, :n] = torch.where(agent, rewards, 0.0)
            out["advantages"][i, :n] = torch.where(loss, token_adv, 0.0)
            out["old_logprobs"][i, :n] = torch.where(torch.isfinite(old) & attention.bool(), old, 0.0)
            out["final_rewards"][i] = final
            out["group_ids"][i] = int(row.get("group_id") or 0)
        return out


# --------------------------------------------------------------------------- log-probs and loss


def token_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, temperature: float = 1.0) -> torch.Tensor:
    """Per-position log-probabilities of the tokens in ``input_ids`` under ``model``.

    Returns a float32 ``[batch, seq]`` tensor where position ``t`` holds
    ``log_softmax(logits[t - 1] / temperature)[input_ids[t]]`` — the convention of
    the stored ``padded_logprobs``. Position 0 and padding positions
    (``attention_mask == 0``) hold 0. ``temperature == 0`` (greedy sampling)
    means unscaled logits, as in the agent. Differentiable; call it under
    ``torch.no_grad()`` for reference log-probs.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}.")
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    out = torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
    if attention_mask is not None:
        out = torch.where(attention_mask.bool(), out, torch.zeros_like(out))
    return out


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-style clipped policy loss, averaged over the loss tokens of the batch.

    Per loss token: ``-min(ratio * A, clip(ratio, 1 - clip_eps, 1 + clip_eps) * A)``
    with ``ratio = exp(logprobs - old_logprobs)``, plus ``kl_coef * k3`` where
    ``k3 = exp(ref - logprobs) - (ref - logprobs) - 1`` (an unbiased, non-negative
    estimate of ``KL(policy || ref)``) when ``kl_coef > 0``. The loss is the sum
    over tokens with ``loss_mask`` divided by their number (token-level mean,
    0 for a batch with no loss token).

    Tokens outside ``loss_mask`` get exactly zero gradient, and NaN/inf in any input
    there cannot leak into the loss or the gradient.

    Returns ``(loss, metrics)``; metrics are floats: ``loss``, ``policy_loss``,
    ``kl`` (mean k3 vs ``ref_logprobs``, 0 without), ``approx_kl_old`` (mean k3 vs
    the sampling policy), ``clip_fraction``, ``ratio_mean``, ``advantage_mean``,
    ``num_tokens``.
    """
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs (token_logprobs of the reference model, under torch.no_grad()).")
    shapes = {t.shape for t in (logprobs, old_logprobs, advantages, loss_mask)}
    if len(shapes) != 1:
        raise ValueError(f"logprobs, old_logprobs, advantages and loss_mask must share one shape, got {sorted(map(tuple, shapes))}.")
    mask = loss_mask.bool()
    zero = torch.zeros_like(logprobs)
    old = old_logprobs.to(logprobs.dtype).detach()
    adv = torch.where(mask, advantages.to(logprobs.dtype), zero).detach()
    log_ratio = torch.where(mask, logprobs - old, zero)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    kl = zero
    if ref_logprobs is not None:
        delta = torch.where(mask, ref_logprobs.to(logprobs.dtype).detach() - logprobs, zero)
        kl = torch.exp(delta) - delta - 1.0
    total = per_token + kl_coef * kl if kl_coef > 0 else per_token
    n = mask.sum()
    denom = n.clamp(min=1).to(logprobs.dtype)
    loss = torch.where(mask, total, zero).sum() / denom
    with torch.no_grad():
        k3_old = (ratio - 1.0) - log_ratio  # k3 estimate of KL(old || new) on samples of old
        metrics = {
            "loss": float(loss),
            "policy_loss": float(torch.where(mask, per_token, zero).sum() / denom),
            "kl": float(torch.where(mask, kl, zero).sum() / denom),
            "approx_kl_old": float(torch.where(mask, k3_old, zero).sum() / denom),
            "clip_fraction": float(((ratio - 1.0).abs() > clip_eps).logical_and(mask).sum() / denom),
            "ratio_mean": float(torch.where(mask, ratio, zero).sum() / denom),
            "advantage_mean": float(adv.sum() / denom),
            "num_tokens": int(n),
        }
    return loss, metrics


__all__ = [
    "ADVANTAGE_MODES",
    "DROP_REASONS",
    "FLAT_FEATURES",
    "PreparedRollouts",
    "RolloutCollator",
    "RolloutFilter",
    "RolloutFilterReport",
    "group_advantages",
    "grpo_loss",
    "load_rollouts",
    "prepare_rollouts",
    "token_logprobs",
]
