"""Agents: things that answer an environment's messages."""

from .base import Agent
from .hf import SamplingConfig, TransformersAgent
from .scripted import ScriptedAgent

__all__ = ["Agent", "SamplingConfig", "ScriptedAgent", "TransformersAgent"]
