"""``hf_rollouts.envs.reasoning_gym``, the public name of :mod:`hf_rollouts.envs.adapters.reasoning_gym`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..adapters.reasoning_gym import PROMPT_STYLES, ReasoningGymConfig, ReasoningGymEnv, ReasoningGymEpisode

__all__ = ["PROMPT_STYLES", "ReasoningGymConfig", "ReasoningGymEnv", "ReasoningGymEpisode"]
