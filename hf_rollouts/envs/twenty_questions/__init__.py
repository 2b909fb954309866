"""``hf_rollouts.envs.twenty_questions``, the public name of :mod:`hf_rollouts.envs.games.twenty_questions`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.twenty_questions import Gamemaster, KnowledgeBase, KnowledgeBaseGamemaster, TwentyQuestionsEnv

__all__ = ["Gamemaster", "KnowledgeBase", "KnowledgeBaseGamemaster", "TwentyQuestionsEnv"]
