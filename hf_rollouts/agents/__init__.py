"""Agents: things that answer an environment's messages."""

from .base import Agent
from .hf import SamplingConfig, TransformersAgent
from .openai import OpenAIChatAgent, OpenAIRequestError, OpenAISettings
from .scripted import ScriptedAgent

__all__ = ["Agent", "OpenAIChatAgent", "OpenAIRequestError", "OpenAISettings", "SamplingConfig", "ScriptedAgent", "TransformersAgent"]
