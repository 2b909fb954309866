"""``hf_rollouts.envs.twenty_questions.env``, the public name of :mod:`hf_rollouts.envs.games.twenty_questions.env`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.twenty_questions.env import TwentyQuestionsEnv

__all__ = ["TwentyQuestionsEnv"]
