"""The run kit of the training scripts (``scripts/train_grpo.py``, ``train_tools.py``, ``train_trl.py``): what a
training *run* needs around the math of :mod:`hf_rollouts.training`, which knows no envs, agents or pipeline.

* :mod:`.runs`: the scripts' options as dataclasses (declared once), the policy they load, the held-out evaluation
  they print, their tables;
* :func:`task_splits` (:mod:`.splits`): a run's train and held-out task rows, from files or an env;
* :func:`write_summary` and :func:`save_learning_curve` (:mod:`.report`): what a run leaves behind;
* :mod:`.demonstrations`: the scripted tool demonstrator and the tool metrics (``scripts/train_tools.py``).

A round's rollouts come from :func:`hf_rollouts.rounds.collect_rollouts`; held-out success from
:func:`hf_rollouts.evaluation.evaluate_agent`.
"""

from .report import save_learning_curve, write_summary
from .splits import task_splits

__all__ = ["save_learning_curve", "task_splits", "write_summary"]
