"""Tool figures for docs/guides/tools.md: MCP latency (in-process and stdio) and hidden_function success rates.

    python scripts/benchmark_tools.py

Prints, one run: the time to connect to an MCP server and list its tools, and the mean time of one call after
that, for an in-process server and for a stdio server (a subprocess of this Python); then hidden_function success
rates for an agent that calls the tool and copies its answer, one that guesses, and the embedded tiny model
(random weights) sampling freely.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from hf_rollouts.tools import Toolbox, run_tool_calls
from hf_rollouts.tools.mcp import MCPTools
from hf_rollouts.types import Action, ToolCall

SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("calc")
@server.tool()
def add(a: int, b: int) -> int:
    \"\"\"Add.\"\"\"
    return a + b
if __name__ == "__main__":
    server.run("stdio")
"""


def mcp_figures(label: str, make, calls: int = 50) -> None:
    start = time.perf_counter()
    source = make()
    box = Toolbox(source.tools())
    connect = time.perf_counter() - start
    times = []
    for i in range(calls):
        t = time.perf_counter()
        (result,) = run_tool_calls(box, [ToolCall("add", {"a": i, "b": 1})], None, timeout=30)
        assert result.status == "ok" and result.content == str(i + 1), result
        times.append(time.perf_counter() - t)
    source.close()
    print(
        f"MCP {label}: connect + list {connect:.3f} s; "
        f"one call {1000 * statistics.mean(times):.2f} ms (mean of {calls})"
    )


def main() -> None:
    from mcp.server.mcpserver import MCPServer

    namespace: dict = {}
    exec(SERVER.replace('if __name__ == "__main__":\n    server.run("stdio")', ""), namespace)
    server: MCPServer = namespace["server"]
    mcp_figures("in-process", lambda: MCPTools(server))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "server.py"
        script.write_text(SERVER)
        mcp_figures("stdio", lambda: MCPTools(f"stdio:{sys.executable} {script}"))

    from hf_rollouts.agents.base import Agent
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.envs.hidden_function import HiddenFunctionEnv

    agent = load_agent("tiny")
    tok = agent.tokenizer

    class Scripted(Agent):
        def __init__(self, use_tool: bool) -> None:
            self.use_tool = use_tool

        def get_action(self, messages, agent_state=None):
            raise NotImplementedError

        def act(self, request):
            x = int(request.messages[0]["content"].split("f(")[1].split(")")[0])
            if self.use_tool and request.agent_state is None:
                text = f'<tool_call>\n{{"name": "hidden_f", "arguments": {{"x": {x}}}}}\n</tool_call>'
            else:
                last = request.messages[-1]
                text = last["content"] if last["role"] == "tool" else "42"
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            return Action(text, ids, None, True), 1

    env = HiddenFunctionEnv(tok, {"max_turns": 3})
    tasks = env._task_list("eval", 64)
    for label, player in [
        ("an agent that calls the tool", Scripted(True)),
        ("an agent that guesses", Scripted(False)),
        ("the tiny model (random weights, temperature 1)", agent),
    ]:
        out = env.run_trial(tasks, player, num_rollouts=1)
        wins = sum(r == 1.0 for r in out["final_rewards"])
        calls = sum(out["num_tool_calls"])
        errors = sum(out["num_tool_errors"])
        print(f"hidden_function, 64 eval tasks, {label}: {wins}/64 won, {calls} tool calls, {errors} tool errors")


if __name__ == "__main__":
    main()
