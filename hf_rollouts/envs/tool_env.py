"""``ToolEnv``: a :class:`~hf_rollouts.envs.base.MultistepEnv` whose tools are declared once, on the class, and
optionally taken from MCP servers named in ``env_config``.

::

    class CalculatorEnv(ToolEnv):
        tools = (add, multiply)          # plain functions: schemas from get_json_schema, state via `state`

``env_config["mcp_servers"]`` (a list of ``"stdio:COMMAND ARG ..."`` or ``http(s)://`` specs) adds each server's
tools (:class:`hf_rollouts.tools.mcp.MCPTools`). Starting a command or calling a host named by task rows is
refused unless the user allows that exact spec (``allowed_env_models`` / ``--allow-env-model``), like any
``model_config_keys`` value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..tools import Tool
from .base import MultistepEnv
from .config import EnvConfig, option

__all__ = ["ToolEnv", "ToolEnvConfig"]


@dataclass(frozen=True, kw_only=True)
class ToolEnvConfig(EnvConfig):
    mcp_servers: list[str] | None = option(
        None,
        "MCP servers whose tools the env adds ('stdio:COMMAND ARG ...' or an http(s) URL); each spec must be "
        "allowed by the user (allowed_env_models / --allow-env-model).",
    )


class ToolEnv(MultistepEnv):
    """An env with tools (see the module docstring). Subclasses set :attr:`tools` and the usual hooks."""

    tools: ClassVar[tuple[Callable[..., Any] | Tool, ...]] = ()
    config_class: ClassVar[type[EnvConfig]] = ToolEnvConfig
    model_config_keys: ClassVar[tuple[str, ...]] = ("mcp_servers",)

    def _tools(self) -> list[Any] | None:
        tools: list[Any] = list(type(self).tools)
        for spec in self.config.mcp_servers or []:
            from ..tools.mcp import MCPTools

            tools += MCPTools(spec).tools()
        return tools or None
