"""Agent programs written against real harnesses, for ``ProgramEnv`` task rows (``"harness_programs:NAME"``).

Each is ``run(endpoint, task)`` (or ``async def``): it builds the harness exactly as its users do, pointed at
``endpoint.base_url`` with ``endpoint.api_key`` and ``endpoint.model``, and returns the final answer as text.
``task``: ``question`` (the user's request) and, for the tool programs, the tool they may call (``add``).
Nothing here reaches the network: the only URL is the endpoint's.
"""

from __future__ import annotations

import json
import os
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # the Agents SDK exports traces to api.openai.com


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


SHORT_CODE_PROMPT = (
    "Solve the task with Python code in {{code_block_opening_tag}} ... {{code_block_closing_tag}}. "
    "You may call add(a, b). End with final_answer(answer)."
)


def _steps(task: dict[str, Any]) -> int:
    return int(task.get("max_steps", 2))


def smolagents_tool_calling(endpoint: Any, task: dict[str, Any]) -> str:
    """smolagents' ``ToolCallingAgent`` with the ``add`` tool, through ``OpenAIServerModel``."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    model = OpenAIServerModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)
    agent = ToolCallingAgent(tools=[tool(add)], model=model, max_steps=_steps(task), verbosity_level=-1)
    return str(agent.run(task["question"]))


def smolagents_tool_calling_stream(endpoint: Any, task: dict[str, Any]) -> str:
    """The same agent with ``stream_outputs=True`` (server-sent events, ``stream_options.include_usage``)."""
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    model = OpenAIServerModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)
    agent = ToolCallingAgent(
        tools=[tool(add)], model=model, max_steps=_steps(task), verbosity_level=-1, stream_outputs=True
    )
    return str(agent.run(task["question"]))


def smolagents_code(endpoint: Any, task: dict[str, Any]) -> str:
    """smolagents' ``CodeAgent`` with ``add`` as a function its code may call; it runs the code the model writes (with
    its local Python interpreter: run such programs with ``isolation="bwrap"``)."""
    from smolagents import CodeAgent, OpenAIServerModel, tool

    model = OpenAIServerModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)
    agent = CodeAgent(tools=[tool(add)], model=model, max_steps=_steps(task), verbosity_level=-1)
    if task.get("short_prompt"):  # smolagents' own prompt is ~4800 tokens of the tiny tokenizer: over its context
        agent.prompt_templates["system_prompt"] = SHORT_CODE_PROMPT
        agent.memory.system_prompt.system_prompt = agent.initialize_system_prompt()
    return str(agent.run(task["question"]))


async def agents_sdk(endpoint: Any, task: dict[str, Any]) -> str:
    """The OpenAI Agents SDK with its Chat Completions model and a function tool; tracing off."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    agent = Agent(
        name="calculator",
        instructions="Use the add tool, then answer with the number only.",
        tools=[function_tool(add)],
        model=OpenAIChatCompletionsModel(model=endpoint.model, openai_client=client),
    )
    result = await Runner.run(
        agent, task["question"], max_turns=_steps(task) + 1, run_config=RunConfig(tracing_disabled=True)
    )
    return str(result.final_output)


async def agents_sdk_stream(endpoint: Any, task: dict[str, Any]) -> str:
    """The same agent run with ``Runner.run_streamed`` (server-sent events; the SDK sends no ``stream_options`` to a
    base URL that is not OpenAI's)."""
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    agent = Agent(
        name="calculator",
        instructions="Use the add tool, then answer with the number only.",
        tools=[function_tool(add)],
        model=OpenAIChatCompletionsModel(model=endpoint.model, openai_client=client),
    )
    run = Runner.run_streamed(
        agent, task["question"], max_turns=_steps(task) + 1, run_config=RunConfig(tracing_disabled=True)
    )
    async for _ in run.stream_events():
        pass
    return str(run.final_output)


def openai_loop(endpoint: Any, task: dict[str, Any]) -> str:
    """A plain ``openai`` client loop: call the model with the tool; run each call it makes; stop on plain text."""
    from openai import OpenAI

    client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    reply = None
    for _ in range(_steps(task) + 1):
        reply = client.chat.completions.create(model=endpoint.model, messages=messages, tools=[ADD_SCHEMA])
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result: Any = add(**json.loads(call.function.arguments))
            except (TypeError, ValueError) as exc:  # the model's arguments: its mistake, told back to it
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    return (reply.choices[0].message.content or "") if reply else ""


def smolagents_vowels(endpoint: Any, task: dict[str, Any]) -> dict[str, Any]:
    """The ``ToolCallingAgent`` of :func:`smolagents_tool_calling`, returning its own graded reward (the vowels its
    answer uses, 0 to 1): the random tiny model earns different rewards, so a GRPO group has something to learn."""
    answer = smolagents_tool_calling(endpoint, task)
    return {"answer": answer, "reward": len(set(answer.lower()) & set("aeiou")) / 5}
