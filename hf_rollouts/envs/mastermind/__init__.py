"""``hf_rollouts.envs.mastermind``, the public name of :mod:`hf_rollouts.envs.games.mastermind`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.mastermind import MastermindEnv, score_guess

__all__ = ["MastermindEnv", "score_guess"]
