"""Tools declared once: plain Python functions → :class:`Tool` (JSON schema from transformers' ``get_json_schema``).

A tool is a plain function (``def`` or ``async def``) with type hints and a Google-style docstring, as
transformers' chat templates expect them::

    def multiply(state: CalcState, a: float, b: float) -> float:
        \"\"\"Multiply two numbers.

        Args:
            a: The first number.
            b: The second number.
        \"\"\"
        state.calls += 1
        return a * b

Its schema (``{"type": "function", "function": {"name", "description", "parameters"}}``) comes from
``transformers.utils.get_json_schema``; nothing here writes schemas by hand. A first parameter named ``state``
is the episode's state object (what ``_initialize_episode`` returned): it is hidden from the schema and bound
per episode, so a tool reaches per-episode data through the state, never through ``self`` (episodes of one env
run concurrently). Tools from an MCP server are :class:`Tool` objects too (:mod:`hf_rollouts.tools.mcp`).

A call's arguments are checked against ``parameters`` with ``jsonschema`` (types, required keys, enums) before the
tool runs (:meth:`Tool.argument_errors`); a schema that is not valid JSON Schema is refused when declared.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonschema
from transformers.utils import get_json_schema

STATE_PARAMETER = "state"


class ToolDeclarationError(ValueError):
    """A tool cannot be declared (no docstring, a parameter without a type hint or description, a duplicate name)."""


@dataclass(frozen=True)
class Tool:
    """One tool: its JSON schema and the callable that runs it.

    Attributes:
        schema: ``{"type": "function", "function": {"name", "description", "parameters"}}``.
        fn: called with the call's arguments as keywords (plus ``state=`` when ``takes_state``); may be
            ``async def`` or return an awaitable.
        takes_state: the function's first parameter is ``state``, the episode's state object.
    """

    schema: dict[str, Any]
    fn: Callable[..., Any]
    takes_state: bool = False

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @cached_property
    def validator(self) -> Any:
        """A ``jsonschema`` validator of the call arguments (:func:`arguments_schema` of ``parameters``); raises
        ``jsonschema.SchemaError`` when that is not a valid JSON Schema."""
        schema = arguments_schema(self.schema["function"].get("parameters") or {"type": "object"})
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        return cls(schema)

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        """What in ``arguments`` does not fit the tool's schema (wrong types, missing required keys, values outside
        an enum), one line per problem naming the argument; empty when they fit."""
        errors = sorted(self.validator.iter_errors(arguments), key=lambda e: [str(p) for p in e.absolute_path])
        return [f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}" for e in errors]

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> Tool:
        """Declare ``fn`` (see the module docstring); :class:`ToolDeclarationError` says what to fix."""
        if isinstance(fn, Tool):
            return fn
        if not callable(fn):
            raise ToolDeclarationError(f"a tool must be a function or a Tool, got {type(fn).__name__} {fn!r:.60}.")
        params = list(inspect.signature(fn).parameters.values())
        takes_state = bool(params) and params[0].name == STATE_PARAMETER
        try:
            schema = get_json_schema(_without_state(fn) if takes_state else fn)
        except Exception as exc:
            name = getattr(fn, "__name__", repr(fn))
            raise ToolDeclarationError(
                f"tool {name!r}: {exc}. A tool needs a type hint on every parameter and a Google-style docstring "
                "with an 'Args:' line per parameter (transformers.utils.get_json_schema reads both); a first "
                "parameter named 'state' receives the episode state and needs neither."
            ) from exc
        return cls(schema, fn, takes_state)


def arguments_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` as a JSON Schema: OpenAPI's ``"nullable": true`` (what ``get_json_schema`` writes for
    ``x: int | None``) becomes a ``"null"`` type (and a ``None`` enum value), which JSON Schema validators read."""

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: walk(v) for k, v in node.items()}
        if out.get("nullable") is True:
            del out["nullable"]
            if "type" in out:
                types = out["type"] if isinstance(out["type"], list) else [out["type"]]
                out["type"] = types if "null" in types else [*types, "null"]
            if isinstance(out.get("enum"), list) and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        return out

    return walk(parameters)


def _without_state(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in of ``fn`` whose signature and annotations lack the leading ``state`` parameter (for its schema)."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())[1:]

    def stand_in(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError

    stand_in.__name__ = fn.__name__
    stand_in.__doc__ = fn.__doc__
    stand_in.__wrapped__ = fn  # get_type_hints resolves names in fn's module
    stand_in.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    stand_in.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != STATE_PARAMETER}
    return stand_in


class Toolbox:
    """An env's tools by name, declared once (per env instance). ``schemas`` go to the chat template."""

    def __init__(self, tools: Iterable[Callable[..., Any] | Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for item in tools:
            tool = Tool.from_function(item)
            try:
                tool.validator  # noqa: B018 (built now, so a bad schema is refused before any episode)
            except jsonschema.SchemaError as exc:
                raise ToolDeclarationError(
                    f"tool {tool.name!r}: its parameters are not a valid JSON Schema ({exc.message}); arguments "
                    "are checked against it before each call. Fix the schema (or the MCP server's input schema)."
                ) from exc
            if tool.name in self.tools:
                raise ToolDeclarationError(f"two tools are named {tool.name!r}; tool names must be unique.")
            self.tools[tool.name] = tool

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def __len__(self) -> int:
        return len(self.tools)

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)
