"""``hf_rollouts.envs.twenty_questions.llm_gamemaster``,
the public name of :mod:`hf_rollouts.envs.games.twenty_questions.llm_gamemaster`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.twenty_questions.llm_gamemaster import (
    DEFAULT_SYSTEM_PROMPT,
    AgentGamemaster,
    gamemaster_from_config,
    parse_answer,
)

__all__ = ["AgentGamemaster", "DEFAULT_SYSTEM_PROMPT", "gamemaster_from_config", "parse_answer"]
