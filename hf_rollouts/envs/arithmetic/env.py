"""``hf_rollouts.envs.arithmetic.env``, the public name of :mod:`hf_rollouts.envs.games.arithmetic.env`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.arithmetic.env import (
    PHRASINGS,
    ArithmeticConfig,
    ArithmeticEnv,
    CalculatorConfig,
    CalculatorEnv,
    calculator,
    last_integer,
)

__all__ = [
    "ArithmeticConfig",
    "ArithmeticEnv",
    "CalculatorConfig",
    "CalculatorEnv",
    "PHRASINGS",
    "calculator",
    "last_integer",
]
