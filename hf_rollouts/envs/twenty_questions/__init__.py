from .env import TwentyQuestionsEnv
from .knowledge import Gamemaster, KnowledgeBase, KnowledgeBaseGamemaster

__all__ = ["Gamemaster", "KnowledgeBase", "KnowledgeBaseGamemaster", "TwentyQuestionsEnv"]
