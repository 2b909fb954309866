"""hf_rollouts: multi-turn RL rollouts as Hugging Face datasets.

Task dataset in, token-exact padded trajectories out. See README.md.
"""

from .agents import Agent, ScriptedAgent, TransformersAgent
from .envs.base import MultistepEnv
from .schema import TASK_FEATURES
from .types import Action, AgentRequest, Episode

__version__ = "0.1.0"
__all__ = ["Action", "Agent", "AgentRequest", "Episode", "MultistepEnv", "ScriptedAgent", "TASK_FEATURES", "TransformersAgent"]
