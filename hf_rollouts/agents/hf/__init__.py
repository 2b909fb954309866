"""A transformers causal LM as a token-level agent: the agent, its KV cache between turns, its backends."""

from .agent import BACKENDS, TransformersAgent
from .kv_cache import kv_reuse_unsafe_reason

__all__ = ["BACKENDS", "TransformersAgent", "kv_reuse_unsafe_reason"]
