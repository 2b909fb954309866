"""Agents: things that answer an environment's messages. They know nothing of environments.

This package's namespace holds only the interface (:class:`Agent`) and the shared
:class:`SamplingConfig`, so code that needs the contract (environments, the rollout
engine) does not import torch-heavy or HTTP agents. The implementations live in
their modules:

* :class:`hf_rollouts.agents.hf.TransformersAgent` — a local transformers model;
* :class:`hf_rollouts.agents.openai.OpenAIChatAgent` — an OpenAI-compatible server;
* :class:`hf_rollouts.agents.vllm.VLLMAgent` — vLLM's engine in this process (vLLM imported lazily);
* :class:`hf_rollouts.agents.scripted.ScriptedAgent` — a fixed script, for tests;
* :func:`hf_rollouts.agents.loading.load_agent` — any of them from a spec string.
"""

from .base import Agent
from .sampling import SamplingConfig

__all__ = ["Agent", "SamplingConfig"]
