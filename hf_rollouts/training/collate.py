"""Padding flattened rollout rows into training tensors (for a ``DataLoader`` or ``accelerate``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .advantages import ADVANTAGE_MODES, AdvantageMode


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
    * ``agent_mask`` (float 0/1): every agent token (the SFT loss mask: demonstrations need no log-probs);
    * ``final_rewards`` (float ``[batch]``, NaN for errors), ``group_ids`` (long ``[batch]``);
    * ``logprob_temperature`` (float ``[batch]``): the temperature each row's stored log-probs are at (its
      ``logprob_settings``; NaN when not recorded). :func:`~.loss.token_logprobs` takes it as
      ``recorded_temperature`` (:func:`~.loss.batch_logprobs` does it for you) and recomputes at it.

    An empty batch (an empty round) gives the same tensors with 0 rows.

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
                raise ValueError(
                    "rows have no 'advantage_mode'; prepare them with prepare_rollouts(flatten=True) or pass "
                    "advantage=."
                )
            return stored
        if self.advantage != "per_token" and stored is not None and stored != self.advantage:
            raise ValueError(
                f"RolloutCollator(advantage={self.advantage!r}) but the rows were prepared with advantage={stored!r}; "
                f"prepare them again with prepare_rollouts(..., advantage={self.advantage!r}) or use advantage=None."
            )
        return self.advantage

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        missing = [
            c
            for c in ("input_ids", "attention_mask", "agent_mask", "per_token_rewards", "old_logprobs")
            if rows and c not in rows[0]
        ]
        if missing:
            raise ValueError(
                f"rows lack {missing}; flatten the rollouts first: prepare_rollouts(source, flatten=True)."
            )
        lengths = [len(r["input_ids"]) for r in rows]
        width = max(lengths, default=0)
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
            "agent_mask": torch.zeros((b, width), dtype=torch.float32),
            "final_rewards": torch.zeros(b, dtype=torch.float32),
            "group_ids": torch.zeros(b, dtype=torch.long),
            "logprob_temperature": torch.full((b,), math.nan, dtype=torch.float32),
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
                    f"row {i} (group {row.get('group_id')}, rollout {row.get('rollout_index')}) has agent tokens "
                    "without "
                    "old log-probabilities or re-tokenized from text (a text-only agent?); use "
                    "RolloutCollator(missing_logprobs='mask') to skip them."
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
            out["agent_mask"][i, :n] = agent.float()
            out["final_rewards"][i] = final
            out["group_ids"][i] = int(row.get("group_id") or 0)
            settings = row.get("logprob_settings")
            if settings and settings.get("temperature") is not None:
                out["logprob_temperature"][i] = float(settings["temperature"])
        return out
