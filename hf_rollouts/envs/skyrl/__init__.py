"""SkyRL-gym text environments (optional dependency: ``pip install "hf_rollouts[skyrl]"``).

Importing this package does not import ``skyrl_gym``; constructing a :class:`SkyRLGymEnv` does.
"""

from .env import SkyRLEpisode, SkyRLGymConfig, SkyRLGymEnv, skyrl_task

__all__ = ["SkyRLEpisode", "SkyRLGymConfig", "SkyRLGymEnv", "skyrl_task"]
