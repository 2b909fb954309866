"""Environments, each package at its public name ``hf_rollouts.envs.<name>`` (what task rows and users' imports say):

* the contract and its machinery, here: :class:`~.base.MultistepEnv` (the hooks and the doors into the engine),
  its typed config (:mod:`.config`), ``task_data`` checks (:mod:`.task_data`), tool envs (:mod:`.tool_env`), the
  registry and trust rules (:mod:`.registry`) and the conformance check (:mod:`.check`);
* the games: :mod:`.twenty_questions`, :mod:`.mastermind`, :mod:`.guess_number`, :mod:`.hidden_function`,
  :mod:`.arithmetic` (arithmetic and calculator);
* your dataset with a verifier: :mod:`.dataset`;
* the adapters of other ecosystems' envs, on one base (:mod:`.adapter`): :mod:`.textarena`, :mod:`.reasoning_gym`,
  :mod:`.skyrl`, :mod:`.openenv`, :mod:`.verifiers`.

``ENV_REGISTRY`` maps a short name to a class path; classes are imported lazily (by
:func:`~.registry.get_env_class`) so that listing names costs nothing.
"""

from .base import MultistepEnv
from .registry import ENV_REGISTRY, get_env_class

__all__ = ["ENV_REGISTRY", "MultistepEnv", "get_env_class"]
