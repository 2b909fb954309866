"""Running one agent turn's tool calls: concurrently, each within ``tool_timeout``, every failure a result.

:func:`run_tool_calls` is what :meth:`hf_rollouts.envs.base.MultistepEnv._call_tools` does by default. It never
raises for a call: a tool that raises, a call naming no tool, arguments that do not fit the tool's JSON schema
(types, required keys, enums: :meth:`~hf_rollouts.tools.declare.Tool.argument_errors`) or its signature, and a call
that runs past ``timeout`` each become a :class:`~hf_rollouts.types.ToolResult` whose text says what went wrong
(``status`` ``error`` or ``timeout``), which the model reads as the tool's answer. Raise :class:`ToolFailed` from
a tool to answer with your own error text.

Where calls run: ``async def`` tools on the engine loop (:mod:`hf_rollouts.aio`; a call past its timeout is
cancelled); sync tools on the process's reused daemon threads (:data:`hf_rollouts.aio.THREADS`; a call past its
timeout is abandoned there, never joined: Python cannot kill a thread, and its thread is reused once it returns). The
calls of one turn run at the same time. A single sync call without a timeout runs inline, in the caller's thread.
The caller is the env hook that asked for them (``_call_tools``), run on the engine's workers like every sync hook
(never on the loop), so its worker is the one that waits, and other episodes go on meanwhile.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..aio import ENGINE_LOOP, THREADS, resolve
from ..types import ToolCall, ToolResult
from .declare import Tool, Toolbox


class ToolFailed(Exception):
    """Raise from a tool to answer the call with this message as an error (status ``error``), verbatim."""


def result_text(value: Any) -> str:
    """A tool's return value as the text the model reads: a str as is, ``None`` as ``""``, JSON for the rest."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _call(fn: Callable[[], Any]) -> Any:
    return resolve(fn())  # a sync function may hand back an awaitable: awaited on the engine loop


def _bind(tool: Tool, call: ToolCall, state: Any) -> Callable[[], Any] | str:
    """A no-argument callable running ``call``, or the error text when its arguments do not fit."""
    kwargs = dict(call.arguments or {})
    shown = ", ".join(tool.schema["function"].get("parameters", {}).get("properties", {}))
    if tool.takes_state and "state" in kwargs:
        return "Error: 'state' is not an argument of this tool."
    problems = tool.argument_errors(kwargs)
    if problems:
        return f"Error: the arguments do not fit {tool.name}({shown}): {'; '.join(problems)}."
    if tool.takes_state:
        kwargs["state"] = state
    try:
        inspect.signature(tool.fn).bind(**kwargs)
    except TypeError as exc:
        return f"Error: the arguments do not fit {tool.name}({shown}): {exc}."
    return lambda: tool.fn(**kwargs)


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, ToolFailed) else f"Error: {type(exc).__name__}: {exc}"


def run_tool_calls(
    toolbox: Toolbox, calls: list[ToolCall], state: Any, *, timeout: float | None = None
) -> list[ToolResult]:
    """Run well-formed ``calls`` with ``toolbox``'s tools for the episode whose state is ``state``; one result per
    call, in order (see the module docstring). ``timeout``: seconds per call (``None``: no limit)."""
    started = time.monotonic()
    pending: list[tuple[ToolCall, Future | None, str | None, bool]] = []
    for call in calls:
        tool = toolbox.get(call.name)
        if tool is None:
            known = ", ".join(toolbox.tools) or "none"
            pending.append((call, None, f"Error: there is no tool named {call.name!r}; the tools are: {known}.", False))
            continue
        job = _bind(tool, call, state)
        if isinstance(job, str):
            pending.append((call, None, job, False))
        elif tool.is_async:
            pending.append((call, ENGINE_LOOP.submit(job()), None, True))
        elif timeout is None and len(calls) == 1:
            future = Future()
            try:
                future.set_result(_call(job))
            except Exception as exc:
                future.set_exception(exc)
            pending.append((call, future, None, False))
        else:
            pending.append((call, THREADS.submit(lambda job=job: _call(job)), None, False))
    finished: dict[int, float] = {}
    for i, (_, future, _, _) in enumerate(pending):
        if future is not None:  # each call's own duration, whatever order the results are read in
            future.add_done_callback(lambda _, i=i: finished.setdefault(i, time.monotonic()))
    results = []
    for i, (call, future, problem, cancellable) in enumerate(pending):
        if future is None:
            results.append(ToolResult(call, problem or "", "error", 0.0))
            continue
        left = None if timeout is None else max(0.0, started + timeout - time.monotonic())
        try:
            value = future.result(timeout=left)
        except FutureTimeout:
            if cancellable:
                future.cancel()
            text = f"Error: the tool {call.name!r} ran past its time limit of {timeout:g} s and was stopped."
            results.append(ToolResult(call, text, "timeout", time.monotonic() - started))
        except Exception as exc:
            results.append(ToolResult(call, _error_text(exc), "error", finished.get(i, time.monotonic()) - started))
        else:
            results.append(ToolResult(call, result_text(value), "ok", finished.get(i, time.monotonic()) - started))
    return results
