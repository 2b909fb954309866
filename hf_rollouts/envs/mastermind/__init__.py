from .env import MastermindEnv, score_guess

__all__ = ["MastermindEnv", "score_guess"]
