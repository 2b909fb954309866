"""From a rollout dataset to GRPO/PPO training batches, a loss and an update: the math on rollout data, which knows
no envs, agents or pipeline (a round's rollouts come from :func:`hf_rollouts.rounds.collect_rollouts`; a run's
options, policy, task splits and reports from :mod:`hf_rollouts.recipes`).

The update (:mod:`.update`): :func:`grpo_update` (one GRPO update over a prepared round: minibatches, clipping,
optional KL, gradient clipping, several processes through accelerate), :func:`sft_update` (an imitation warm start on
demonstrations, loss on agent tokens only); held-out success is :func:`hf_rollouts.evaluation.evaluate_agent`.

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
temperature); :func:`prepare_rollouts` refuses a dataset of mixed settings (and :func:`grpo_update` and
:func:`logprob_gap` flattened rows of mixed settings, before the first batch), the collator hands each row's
temperature on (``logprob_temperature``) and :func:`token_logprobs` recomputes each row at its own, refusing another
one (:mod:`.convention`).

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
from .loss import batch_logprobs, grpo_loss, model_device, token_logprobs, truncated_importance_weights
from .partial import train_top_layers
from .staleness import StalenessReport, check_max_staleness, first_allowed_version, staleness_filter
from .update import UpdateConfig, UpdateMetrics, flush_denormals, grpo_update, sft_update

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
    "split_by_logprob_settings",
    "token_logprobs",
    "train_top_layers",
    "truncated_importance_weights",
    "StalenessReport",
    "check_max_staleness",
    "first_allowed_version",
    "staleness_filter",
]

MOVED = {
    "collect_rollouts": "from hf_rollouts.rounds import collect_rollouts",
    "task_splits": "from hf_rollouts.recipes import task_splits",
    "write_summary": "from hf_rollouts.recipes import write_summary",
    "save_learning_curve": "from hf_rollouts.recipes import save_learning_curve",
    "runs": "from hf_rollouts.recipes import runs",
    "demonstrations": "from hf_rollouts.recipes import demonstrations",
    "report": "from hf_rollouts.recipes import report",
    "loop": "from hf_rollouts.training import grpo_update, sft_update` (training/update.py) and "
    "`from hf_rollouts.rounds import collect_rollouts",
}
"""Names that left ``hf_rollouts.training`` when it became the math alone (issue 42) -> the import to write now."""


def __getattr__(name: str):
    """An import of a name that moved out says where it went (``from hf_rollouts.training import collect_rollouts``:
    ``from hf_rollouts.rounds import collect_rollouts``)."""
    if name in MOVED:
        raise ImportError(
            f"hf_rollouts.training.{name} moved: training is the math on rollout data and knows no envs, agents or "
            f"pipeline. Write `{MOVED[name]}`.",
            name=f"hf_rollouts.training.{name}",
        )
    raise AttributeError(f"module 'hf_rollouts.training' has no attribute {name!r}")
