"""hf_rollouts: multi-turn RL rollouts as Hugging Face datasets.

Task dataset in, token-exact padded trajectories out. See README.md and docs/.
"""

from ._version import __version__
from .agents import Agent
from .agents.hf import TransformersAgent
from .agents.scripted import ScriptedAgent
from .envs.base import MultistepEnv
from .mapping import RolloutMap, rollout_map
from .pipeline import generate_rollouts
from .rounds import collect_rollouts
from .schema import ROLLOUT_COLUMNS, TASK_FEATURES
from .types import Action, AgentRequest, Episode
from .viewer import view

__all__ = [
    "Action",
    "Agent",
    "AgentRequest",
    "Episode",
    "MultistepEnv",
    "ROLLOUT_COLUMNS",
    "RolloutMap",
    "ScriptedAgent",
    "TASK_FEATURES",
    "TransformersAgent",
    "__version__",
    "collect_rollouts",
    "generate_rollouts",
    "rollout_map",
    "view",
]
