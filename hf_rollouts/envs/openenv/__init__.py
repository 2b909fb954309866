"""``hf_rollouts.envs.openenv``, the public name of :mod:`hf_rollouts.envs.adapters.openenv`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.openenv import OpenEnvConfig, OpenEnvEnv, OpenEnvEpisode

__all__ = ["OpenEnvConfig", "OpenEnvEnv", "OpenEnvEpisode"]
