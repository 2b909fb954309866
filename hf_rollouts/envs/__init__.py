"""Environments: the :class:`~.base.MultistepEnv` base class, the games, and the registry.

``ENV_REGISTRY`` maps a short name to a class path; classes are imported lazily
(by :func:`~.registry.get_env_class`) so that listing names costs nothing.
"""

from .base import MultistepEnv
from .registry import ENV_REGISTRY, get_env_class

__all__ = ["ENV_REGISTRY", "MultistepEnv", "get_env_class"]
