"""verifiers environments, classic API (optional dependency: ``pip install "hf_rollouts[verifiers]"``).

Importing this package does not import ``verifiers``; constructing a :class:`VerifiersEnv` does.
"""

from .env import VerifiersConfig, VerifiersEnv, VerifiersEpisode, module_of

__all__ = ["VerifiersConfig", "VerifiersEnv", "VerifiersEpisode", "module_of"]
