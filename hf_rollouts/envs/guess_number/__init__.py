"""``hf_rollouts.envs.guess_number``, the public name of :mod:`hf_rollouts.envs.games.guess_number`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.guess_number import GuessNumberEnv

__all__ = ["GuessNumberEnv"]
