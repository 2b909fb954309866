"""Agents: things that answer an environment's messages. They know nothing of environments.

Importing this package loads only the interface (:class:`Agent`) and the shared
:class:`SamplingConfig`, so code that needs the contract (environments, the rollout
engine) does not import torch-heavy or HTTP agents. The implementations are reachable
from here all the same, each imported on first use (a module ``__getattr__``):

* :class:`hf_rollouts.agents.TransformersAgent` — a local transformers model (``agents.hf``);
* :class:`hf_rollouts.agents.OpenAIChatAgent` — an OpenAI-compatible server (``agents.openai``);
* :class:`hf_rollouts.agents.VLLMAgent` — vLLM's engine in this process (``agents.vllm``; vLLM
  itself imported only when one is built);
* :class:`hf_rollouts.agents.ScriptedAgent` — a fixed script, for tests (``agents.scripted``);
* :func:`hf_rollouts.agents.load_agent` and :class:`hf_rollouts.agents.AgentRecipe` — any of them from a spec
  string, here or in another process (``agents.loading``).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Agent
from .sampling import SamplingConfig

# No static import of the implementations here (not even under TYPE_CHECKING): the layering test reads every
# import statement, and the interface must not depend on torch or HTTP agents.
_LAZY = {
    "TransformersAgent": "hf",
    "OpenAIChatAgent": "openai",
    "OpenAISettings": "openai",
    "VLLMAgent": "vllm",
    "ScriptedAgent": "scripted",
    "AgentRecipe": "loading",
    "load_agent": "loading",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["Agent", "AgentRecipe", "OpenAIChatAgent", "OpenAISettings", "SamplingConfig", "ScriptedAgent",
           "TransformersAgent", "VLLMAgent", "load_agent"]  # fmt: skip
