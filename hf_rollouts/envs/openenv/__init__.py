"""OpenEnv environment servers (optional dependency: ``pip install "hf_rollouts[openenv]"``).

Importing this package does not import ``openenv``; constructing an :class:`OpenEnvEnv` does.
"""

from .env import OpenEnvConfig, OpenEnvEnv, OpenEnvEpisode

__all__ = ["OpenEnvConfig", "OpenEnvEnv", "OpenEnvEpisode"]
