"""``hf_rollouts.envs.hidden_function.env``, the public name of :mod:`hf_rollouts.envs.games.hidden_function.env`.

Task rows' ``env_class_path`` and users' imports name it; these are the objects defined there.
"""

from __future__ import annotations

from ..games.hidden_function.env import HiddenFunctionConfig, HiddenFunctionEnv, hidden_f

__all__ = ["HiddenFunctionConfig", "HiddenFunctionEnv", "hidden_f"]
