"""``hf_rollouts.envs.openenv.env``, the public name of :mod:`hf_rollouts.envs.adapters.openenv.env`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.openenv.env import OpenEnvConfig, OpenEnvEnv, OpenEnvEpisode

__all__ = ["OpenEnvConfig", "OpenEnvEnv", "OpenEnvEpisode"]
