"""Tools for environments: declared once as plain functions, run per call within limits, or taken from MCP servers.

* :mod:`.declare` — :class:`Tool`, :class:`Toolbox`: functions → JSON schemas (``transformers.utils.get_json_schema``),
  the episode's state bound through a first parameter named ``state``;
* :mod:`.run` — :func:`run_tool_calls`: one turn's calls, concurrently, each within ``tool_timeout``; failures are
  results the model reads, never exceptions;
* :mod:`.mcp` — :class:`MCPTools`: the tools of an MCP server (PyPI ``mcp``), in-process or started as a command.

How tool calls are parsed from the model's sampled ids and how results are appended token-exact is the chat
layer's job (:mod:`hf_rollouts.chat.tool_calls`, :mod:`hf_rollouts.chat.tool_turns`); the episode loop
(:mod:`hf_rollouts.rollout.tool_loop`) applies the limits.
"""

from .declare import Tool, Toolbox, ToolDeclarationError
from .run import ToolFailed, result_text, run_tool_calls

__all__ = ["Tool", "ToolDeclarationError", "ToolFailed", "Toolbox", "result_text", "run_tool_calls"]
