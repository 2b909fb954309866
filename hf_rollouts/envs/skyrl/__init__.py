"""``hf_rollouts.envs.skyrl``, the public name of :mod:`hf_rollouts.envs.adapters.skyrl`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.skyrl import SkyRLEpisode, SkyRLGymConfig, SkyRLGymEnv, skyrl_task

__all__ = ["SkyRLEpisode", "SkyRLGymConfig", "SkyRLGymEnv", "skyrl_task"]
