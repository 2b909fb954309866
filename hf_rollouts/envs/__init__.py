"""Environments, and the short-name registry the CLI uses.

``ENV_REGISTRY`` maps a short name to a class path; classes are imported lazily
so that listing names costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import MultistepEnv

ENV_REGISTRY: dict[str, str] = {
    "twenty_questions": "hf_rollouts.envs.twenty_questions.TwentyQuestionsEnv",
    "mastermind": "hf_rollouts.envs.mastermind.MastermindEnv",
    "guess_number": "hf_rollouts.envs.guess_number.GuessNumberEnv",
}


def get_env_class(name: str) -> "type[MultistepEnv]":
    """Resolve a short name (``twenty_questions``) or a full class path under ``hf_rollouts.envs``."""
    from ..schema import resolve_env_class

    path = ENV_REGISTRY.get(name, name)
    if "." not in path:
        raise KeyError(f"Unknown environment {name!r}. Known names: {sorted(ENV_REGISTRY)}.")
    return resolve_env_class(path)
