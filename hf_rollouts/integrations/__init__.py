"""Bridges from hf_rollouts environments to training libraries.

* :mod:`.trl` — TRL's ``GRPOTrainer(rollout_func=...)``: :func:`~.trl.to_trl_dataset`,
  :func:`~.trl.make_rollout_func` and the :func:`~.trl.env_reward` reward function.

Each bridge imports its library lazily, so ``import hf_rollouts.integrations`` works without it.
"""
