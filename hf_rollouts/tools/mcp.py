"""Tools from an MCP server (Model Context Protocol; ``pip install "hf_rollouts[mcp]"``, PyPI ``mcp`` >= 2).

:class:`MCPTools` connects to one server, lists its tools (their JSON schemas become the env's tool schemas) and
calls them. The server is

* an in-process server object (``mcp.server.mcpserver.MCPServer``, ``mcp.server.Server``), built by the env's
  own code;
* ``"stdio:COMMAND ARG ..."``: a command started as a subprocess, spoken to over stdin/stdout;
* ``"http://..."`` / ``"https://..."``: a Streamable HTTP endpoint.

**Trust**: a server named in ``env_config`` (an env's ``mcp_servers`` key) is a command to run or a host to call,
named by whoever wrote the task rows. Like ``env_class_path``, it is used only when the user allows that exact
spec (``allowed_env_models=[spec]``, CLI ``--allow-env-model SPEC``): :func:`hf_rollouts.envs.registry.validate_tasks`
refuses it before anything starts.

One connection per :class:`MCPTools`, opened on first use on the engine loop
(:data:`hf_rollouts.aio.ENGINE_LOOP`) and kept for every later call (a stdio server is one subprocess for the
whole run), closed by :meth:`MCPTools.close` or at exit. A call's result is the text of its content blocks;
``is_error`` answers (MCP returns tool failures as results, not exceptions) become tool errors the model reads.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import shlex
from typing import Any

from ..aio import ENGINE_LOOP
from .declare import Tool
from .run import ToolFailed

__all__ = ["MCPTools"]

MCP_INSTALL = 'pip install "hf_rollouts[mcp]"  (PyPI mcp >= 2)'


def _client_class() -> Any:
    try:
        from mcp import Client
    except ImportError as exc:  # an optional dependency, checked when the object is built
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("mcp")
        except PackageNotFoundError:
            found = None
        why = (
            f"mcp {found} is installed, which has no mcp.Client (verifiers 0.3 pins mcp<2; use a venv without it)"
            if found
            else "the mcp package is not installed"
        )
        raise ImportError(f"MCP tool servers need mcp>=2.3: {why}. Install {MCP_INSTALL}.") from exc
    return Client


def server_target(spec: Any) -> Any:
    """What ``mcp.Client`` connects to for ``spec`` (a ``stdio:`` command, a URL, or a server object)."""
    if not isinstance(spec, str):
        return spec
    if spec.startswith("stdio:"):
        from mcp.client.stdio import StdioServerParameters

        argv = shlex.split(spec[len("stdio:") :])
        if not argv:
            raise ValueError(f"MCP server spec {spec!r} names no command; write 'stdio:COMMAND ARG ...'.")
        return StdioServerParameters(command=argv[0], args=argv[1:])
    if spec.startswith(("http://", "https://")):
        return spec
    raise ValueError(f"MCP server spec {spec!r}: write 'stdio:COMMAND ARG ...' or an http(s) URL.")


def _text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(block.model_dump(mode="json"), ensure_ascii=False))
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class MCPTools:
    """The tools of one MCP server (see the module docstring); :meth:`tools` gives them as :class:`Tool` objects."""

    def __init__(self, server: Any, *, connect_timeout: float = 60.0) -> None:
        self._client_cls = _client_class()
        self.spec = server
        self._target = server_target(server)
        self.connect_timeout = connect_timeout
        self._client: Any = None
        self._closed: asyncio.Event | None = None
        self._task: Any = None
        self._ready: asyncio.Future | None = None

    async def _serve(self, ready: asyncio.Future) -> None:
        self._closed = asyncio.Event()
        try:
            async with self._client_cls(self._target) as client:
                self._client = client
                ready.set_result(client)
                await self._closed.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                raise

    async def _connected(self) -> Any:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.ensure_future(self._serve(self._ready))
            atexit.register(self.close)
        return await asyncio.wait_for(asyncio.shield(self._ready), self.connect_timeout)

    def _run(self, coro: Any, timeout: float | None = None) -> Any:
        return ENGINE_LOOP.call(coro, timeout)

    async def _list(self) -> list[Any]:
        client = await self._connected()
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = getattr(page, "next_cursor", None)
            if not cursor:
                return tools

    def tools(self) -> list[Tool]:
        """The server's tools, each a :class:`Tool` whose call goes to the server (blocks while listing)."""
        return [self._tool(t) for t in self._run(self._list())]

    def _tool(self, listed: Any) -> Tool:
        name = listed.name
        schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": listed.description or "",
                "parameters": listed.input_schema or {"type": "object", "properties": {}},
            },
        }

        async def call(**arguments: Any) -> str:
            client = await self._connected()
            result = await client.call_tool(name, arguments)
            text = _text(result)
            if getattr(result, "is_error", False):
                raise ToolFailed(text or f"Error: the MCP tool {name!r} failed.")
            return text

        call.__name__ = name
        return Tool(schema, call)

    def close(self) -> None:
        """Close the connection (a stdio server's subprocess ends)."""
        closed, task = self._closed, self._task
        if closed is None or task is None:
            return
        loop = ENGINE_LOOP.loop()
        loop.call_soon_threadsafe(closed.set)
        try:
            ENGINE_LOOP.call(asyncio.wait_for(asyncio.shield(task), 10), 15)
        except Exception:  # closing is best effort (at exit, the loop may be gone)
            pass
        self._closed = self._task = self._ready = None
