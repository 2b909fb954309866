"""An OpenAI-compatible inference server as an agent: token mode (``/v1/completions`` with prompt ids)
or chat mode, negotiated once per server (see :mod:`.agent`)."""

from .agent import OpenAIChatAgent
from .negotiation import Capabilities
from .settings import (
    OpenAIHTTPError,
    OpenAIRequestError,
    OpenAISettings,
    chat_completions_url,
    completions_url,
    parse_openai_spec,
)

__all__ = [
    "Capabilities",
    "OpenAIChatAgent",
    "OpenAIHTTPError",
    "OpenAIRequestError",
    "OpenAISettings",
    "chat_completions_url",
    "completions_url",
    "parse_openai_spec",
]
