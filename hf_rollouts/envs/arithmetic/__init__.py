"""``hf_rollouts.envs.arithmetic``, the public name of :mod:`hf_rollouts.envs.games.arithmetic`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.arithmetic import (
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
