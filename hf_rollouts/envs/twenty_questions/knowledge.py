"""``hf_rollouts.envs.twenty_questions.knowledge``,
the public name of :mod:`hf_rollouts.envs.games.twenty_questions.knowledge`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.twenty_questions.knowledge import (
    NO,
    UNANSWERABLE_PHRASES,
    UNKNOWN,
    YES,
    Gamemaster,
    KnowledgeBase,
    KnowledgeBaseGamemaster,
    normalize,
)

__all__ = [
    "Gamemaster",
    "KnowledgeBase",
    "KnowledgeBaseGamemaster",
    "NO",
    "UNANSWERABLE_PHRASES",
    "UNKNOWN",
    "YES",
    "normalize",
]
