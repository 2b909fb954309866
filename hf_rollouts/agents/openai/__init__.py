"""An OpenAI-compatible inference server as an agent."""

from .agent import OpenAIChatAgent, OpenAIRequestError, OpenAISettings, chat_completions_url, parse_openai_spec

__all__ = ["OpenAIChatAgent", "OpenAIRequestError", "OpenAISettings", "chat_completions_url", "parse_openai_spec"]
