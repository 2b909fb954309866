"""Environments, in three groups:

* the contract and its machinery, here: :class:`~.base.MultistepEnv` (the hooks and the doors into the engine),
  its typed config (:mod:`.config`), ``task_data`` checks (:mod:`.task_data`), tool envs (:mod:`.tool_env`), the
  registry and trust rules (:mod:`.registry`), the conformance check (:mod:`.check`) and the public names
  (:mod:`.public_names`);
* the games, in :mod:`.games` (Twenty Questions, Mastermind, guess-the-number, hidden function, arithmetic and
  calculator);
* the adapters of other ecosystems' envs, in :mod:`.adapters`, on one base (:mod:`.adapters.adapter`).

Games and adapters keep their public names ``hf_rollouts.envs.<name>`` (what task rows and users' imports say):
plain modules that import from where the code lives (:mod:`.public_names`). ``ENV_REGISTRY`` maps a short name to a
class path; classes are imported lazily (by :func:`~.registry.get_env_class`) so that listing names costs nothing.
"""

from .base import MultistepEnv
from .registry import ENV_REGISTRY, get_env_class

__all__ = ["ENV_REGISTRY", "MultistepEnv", "get_env_class"]
