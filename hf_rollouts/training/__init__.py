"""From a rollout dataset to GRPO/PPO training batches and a loss.

The loop pieces (:mod:`.loop`): :func:`collect_rollouts` (a round of fresh rollouts, never a cache replay),
:func:`grpo_update` (one GRPO update over a prepared round: minibatches, clipping, optional KL, gradient clipping,
several processes through accelerate), :func:`sft_update` (an imitation warm start on demonstrations, loss on agent
tokens only); held-out success is :func:`hf_rollouts.evaluation.evaluate_agent`.

Underneath, three pieces, usable separately:

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
  KL penalty; :func:`train_top_layers` freezes all but the top of a decoder, and
  :func:`shuffle_advantages` makes a control run (rewards shuffled within groups).

Position convention, shared with the rollout data: position ``t`` of a sequence
holds ``log p(input_ids[t] | input_ids[:t])`` computed as
``log_softmax(logits / temperature)`` (the agent's convention, see
:mod:`hf_rollouts.agents.hf`); position 0 has no prediction and holds 0. The
stored ``padded_logprobs`` and :func:`token_logprobs` both follow it, so their
difference is the log importance ratio with no shifting by the caller. Every rollout records how its log-probs were
made (``logprob_settings``: kind, temperature, top-p, top-k, agent hash; an inference server's may be raw, before
temperature); :func:`prepare_rollouts` refuses a dataset of mixed settings, the collator hands each row's
temperature on (``logprob_temperature``) and :func:`token_logprobs` recomputes at it, refusing another one
(:mod:`.convention`).

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

from .advantages import ADVANTAGE_MODES, DROP_REASONS, RolloutFilter, RolloutFilterReport, group_advantages
from .agreement import LogprobGap, logprob_gap
from .collate import RolloutCollator
from .control import shuffle_advantages
from .convention import check_logprob_convention, read_logprob_convention, split_by_logprob_settings
from .data import FLAT_FEATURES, PreparedRollouts, load_rollouts, prepare_rollouts
from .loop import (
    UpdateConfig,
    UpdateMetrics,
    collect_rollouts,
    flush_denormals,
    grpo_update,
    sft_update,
    task_splits,
)
from .loss import batch_logprobs, grpo_loss, model_device, token_logprobs, truncated_importance_weights
from .partial import train_top_layers
from .report import save_learning_curve, write_summary

__all__ = [
    "ADVANTAGE_MODES",
    "DROP_REASONS",
    "FLAT_FEATURES",
    "LogprobGap",
    "PreparedRollouts",
    "RolloutCollator",
    "RolloutFilter",
    "RolloutFilterReport",
    "UpdateConfig",
    "UpdateMetrics",
    "batch_logprobs",
    "check_logprob_convention",
    "collect_rollouts",
    "flush_denormals",
    "group_advantages",
    "grpo_loss",
    "grpo_update",
    "logprob_gap",
    "model_device",
    "load_rollouts",
    "prepare_rollouts",
    "read_logprob_convention",
    "sft_update",
    "shuffle_advantages",
    "save_learning_curve",
    "split_by_logprob_settings",
    "task_splits",
    "token_logprobs",
    "train_top_layers",
    "truncated_importance_weights",
    "write_summary",
]
