from .env import GuessNumberEnv

__all__ = ["GuessNumberEnv"]
