"""reasoning-gym datasets as environments (optional dependency: ``pip install "hf_rollouts[reasoning_gym]"``).

Importing this package does not import ``reasoning_gym``; constructing a :class:`ReasoningGymEnv` does.
"""

from .env import PROMPT_STYLES, ReasoningGymConfig, ReasoningGymEnv, ReasoningGymEpisode

__all__ = ["PROMPT_STYLES", "ReasoningGymConfig", "ReasoningGymEnv", "ReasoningGymEpisode"]
