"""``hf_rollouts.envs.verifiers``, the public name of :mod:`hf_rollouts.envs.adapters.verifiers`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.verifiers import VerifiersConfig, VerifiersEnv, VerifiersEpisode, module_of

__all__ = ["VerifiersConfig", "VerifiersEnv", "VerifiersEpisode", "module_of"]
