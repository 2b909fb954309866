"""Episodes/s of real agent harnesses through the agent-program endpoint, side by side with the same harness against a
bare stub server.

Each harness of ``tests/harness_programs.py`` (smolagents' ``ToolCallingAgent``, a plain ``openai`` loop, the OpenAI
Agents SDK) plays ``--episodes`` episodes at once, every one a tool call (``add``) then the answer, in one run:

* **stub**: every episode the program in a fresh Python process (as ProgramEnv runs it), against a loopback server
  that answers each request at once with the canned reply (no model, no rendering, no recording): what the harness
  and its process cost by themselves;
* **hf_rollouts**: ``generate_rollouts`` of ``ProgramEnv`` rows (one task, ``--episodes`` rollouts) with an instant
  token agent over the tiny model's tokenizer answering the same replies as sampled ids: the endpoint renders each
  request with the chat template, records it token-exactly (samples included) and parses the tool calls back.

Figures: wall seconds (best of ``--repeats`` runs of each side, interleaved), episodes/s and the ratio of
hf_rollouts' episodes/s to the stub's. The harness's process start and imports dominate
both sides (``import agents`` is ~2.8 s of CPU): episodes/s is bounded by the CPUs that start the programs. Run it on
a quiet machine; on a shared one the figures move with the load (say so when you quote them). Both sides start
each program in a session of its own: with the kernel's autogroup scheduling a session is one scheduling group,
so on a loaded machine children sharing one session got a quarter of the CPU share (measured: the same 7.6 s of
child CPU took 27 s of wall in one session, 7.4 s in eight).

    python scripts/benchmark_program_clients.py                   # 16 episodes per harness, about a minute
    python scripts/benchmark_program_clients.py --episodes 32 --harness openai_loop
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path[:0] = [str(ROOT), str(TESTS)]  # this checkout's hf_rollouts, and the harness programs

HARNESSES = ("smolagents_tool_calling", "openai_loop", "agents_sdk")
QUESTION, ANSWER = "What is 17 + 25?", "42"
CALL = {"name": "add", "arguments": {"a": 17, "b": 25}}


def answered(messages: list[dict[str, Any]]) -> bool:
    """Whether the tool's result is already in the conversation (OpenAI tool message, or smolagents' text)."""
    last = messages[-1]
    content = last.get("content") or ""
    text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
    return last.get("role") == "tool" or text.startswith("Observation:")


def final_call(harness: str) -> dict[str, Any] | None:
    """smolagents ends on its final_answer tool; the others on a reply without a call."""
    return {"name": "final_answer", "arguments": {"answer": ANSWER}} if harness.startswith("smolagents") else None


# -- the stub side ---------------------------------------------------------------------------------------------------
def stub_server(harness: str) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the endpoint

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            call = final_call(harness) if answered(body["messages"]) else CALL
            message: dict[str, Any] = {"role": "assistant", "content": None if call else ANSWER}
            if call:
                function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
                message["tool_calls"] = [{"id": "call_1", "type": "function", "function": function}]
            out = json.dumps(
                {
                    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            ).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run_stub(harness: str, episodes: int) -> float:
    server = stub_server(harness)
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    code = (
        "import asyncio, inspect, sys, types, harness_programs as h\n"
        f"ep = types.SimpleNamespace(base_url={base_url!r}, api_key='k', model='m')\n"
        f"r = h.{harness}(ep, {{'question': {QUESTION!r}}})\n"
        "r = asyncio.run(r) if inspect.isawaitable(r) else r\n"
        f"sys.exit(0 if str(r).strip() == {ANSWER!r} else 1)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(  # a session of its own each, as ProgramEnv starts them (the scheduler's autogroups)
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        for _ in range(episodes)
    ]
    failed = [p.returncode for p in procs if p.wait() != 0]
    wall = time.perf_counter() - start
    server.shutdown()
    if failed:
        raise SystemExit(f"stub {harness}: {len(failed)} of {episodes} episodes failed (exit codes {failed})")
    return wall


# -- the hf_rollouts side --------------------------------------------------------------------------------------------
def instant_agent(tokenizer: Any, harness: str) -> Any:
    from hf_rollouts.agents.base import Agent
    from hf_rollouts.types import Action

    class Instant(Agent):
        """Answers at once, as sampled ids: the ``add`` call, then the final answer (as its harness expects it)."""

        def get_action(self, messages, agent_state=None):
            raise NotImplementedError("token-level only")

        def act(self, request):
            call = final_call(harness) if answered(request.messages) else CALL
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>" if call else ANSWER
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            return Action(text=text, token_ids=ids, stopped=True), None

    agent = Instant()
    agent.tokenizer = tokenizer
    return agent


def run_hf_rollouts(harness: str, episodes: int, tokenizer: Any) -> tuple[float, dict[str, Any]]:
    from hf_rollouts import generate_rollouts
    from hf_rollouts.schema import to_task_dataset

    row = {
        "env_class_path": "hf_rollouts.envs.program.ProgramEnv",
        "env_config": {"program": f"harness_programs:{harness}", "verifier": "exact"},
        "task_data": {"question": QUESTION, "answer": ANSWER},
    }
    tasks = to_task_dataset([row])
    start = time.perf_counter()
    (out,) = generate_rollouts(
        tasks, instant_agent(tokenizer, harness), num_rollouts=episodes, seed=0, progress=False,
        allowed_env_modules=["harness_programs"], load_from_cache_file=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if set(out["statuses"]) != {"done"} or set(out["final_rewards"]) != {1.0}:
        raise SystemExit(f"hf_rollouts {harness}: {out['statuses']} {out['errors'][:1]}")
    return wall, {"calls": sum(out["num_turns"]), "samples": sum(out["num_samples"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16, help="Episodes per harness and side, all at once.")
    parser.add_argument("--harness", choices=HARNESSES, action="append", help="Only these (default: all).")
    parser.add_argument("--repeats", type=int, default=2, help="Runs of each side, interleaved; the best is kept.")
    parser.add_argument("--output", default=None, help="Write the figures as JSON here too.")
    args = parser.parse_args(argv)
    from hf_rollouts.tiny_model import build_tiny_model

    _, tokenizer = build_tiny_model(seed=0)
    figures = {}
    for harness in args.harness or HARNESSES:
        stubs, ourss = [], []
        for i in range(args.repeats):  # interleaved, the first side alternating: a load spike hits both
            for side in ("stub", "ours")[:: 1 if i % 2 == 0 else -1]:
                if side == "stub":
                    stubs.append(run_stub(harness, args.episodes))
                else:
                    ourss.append(run_hf_rollouts(harness, args.episodes, tokenizer))
        stub = min(stubs)
        ours, counts = min(ourss, key=lambda x: x[0])
        n = args.episodes
        figures[harness] = {
            "episodes": n, **counts, "stub_s": round(stub, 2), "hf_rollouts_s": round(ours, 2),
            "stub_episodes_per_s": round(n / stub, 2), "hf_rollouts_episodes_per_s": round(n / ours, 2),
            "ratio": round(stub / ours, 3),
        }  # fmt: skip
        print(json.dumps({harness: figures[harness]}), flush=True)
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
