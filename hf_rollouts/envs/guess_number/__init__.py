from .env import GuessNumberEnv, WaitingGuessNumberEnv

__all__ = ["GuessNumberEnv", "WaitingGuessNumberEnv"]
