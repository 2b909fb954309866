from .env import (
    PHRASINGS,
    ArithmeticConfig,
    ArithmeticEnv,
    CalculatorConfig,
    CalculatorEnv,
    calculator,
    last_integer,
)

__all__ = [
    "PHRASINGS",
    "ArithmeticConfig",
    "ArithmeticEnv",
    "CalculatorConfig",
    "CalculatorEnv",
    "calculator",
    "last_integer",
]
