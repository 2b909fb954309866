"""A plain ``openai``-SDK agent with a ``calculator`` tool: the harness ``scripts/train_tools.py --env
program-calculator`` trains through (``ProgramEnv`` task rows name it ``"calculator_agent:run"``).

It is written as a user writes one and imports only the standard library and ``openai`` (each episode's program is a
Python process of its own: importing hf_rollouts there would cost seconds of CPU per episode). ``run(endpoint,
task)`` sends ``task["question"]`` (after ``task["system"]``, if any) with the ``calculator`` tool in ``tools``,
runs every tool call the model makes and sends its result back as a ``tool`` message, and returns the text of the
first reply without tool calls: the final answer, which the env's verifier scores. It makes at most
``task["max_calls"]`` model calls (default 2: the call, then the answer); a reply that still asks for the tool on
the last call ends the episode with that reply's text (usually empty: no answer).
"""

from __future__ import annotations

import json
import operator
import re
from typing import Any

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
EXPRESSION = re.compile(r"\s*(-?\d{1,9})\s*([-+*])\s*(-?\d{1,9})\s*")

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression 'A op B' of two integers (op: +, - or *).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. '123 * 456'"}},
            "required": ["expression"],
        },
    },
}


def calculator(expression: str) -> int:
    """The value of ``"A op B"`` (two integers of at most 9 digits, ``op`` one of ``+ - *``); ``ValueError``
    otherwise."""
    match = EXPRESSION.fullmatch(str(expression))
    if match is None:
        raise ValueError(f"expected 'A op B' with two integers and op in + - *, got {expression!r}")
    a, op, b = match.groups()
    return OPERATORS[op](int(a), int(b))


def run_tool(name: str, arguments: str) -> str:
    """The text a tool call's result is sent back as: the value, or ``error: ...`` (the model's mistake, told back to
    it as a real harness does)."""
    try:
        if name != "calculator":
            raise ValueError(f"unknown tool {name!r}; the only tool is 'calculator'")
        args = json.loads(arguments)
        if not isinstance(args, dict):
            raise ValueError(f"arguments must be a JSON object, got {arguments!r}")
        return str(calculator(**args))
    except (TypeError, ValueError) as exc:
        return f"error: {exc}"


def run(endpoint: Any, task: dict[str, Any]) -> str:
    """One episode: the loop of the module docstring, against ``endpoint.base_url`` with ``endpoint.api_key``."""
    from openai import OpenAI

    client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": task["system"]}] if task.get("system") else []
    messages.append({"role": "user", "content": task["question"]})
    content = ""
    for _ in range(int(task.get("max_calls", 2))):
        reply = client.chat.completions.create(model=endpoint.model, messages=messages, tools=[CALCULATOR_TOOL])
        message = reply.choices[0].message
        content = message.content or ""
        if not message.tool_calls:
            return content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return content
