"""What the agent-program endpoint costs per model call, side by side with the same agent called directly.

An instant agent (it answers every request at once with the same few ids) plays, in one run:

* **direct**: a plain env whose episodes ask the agent ``--calls`` times each (the engine's own loop, no HTTP);
* **endpoint**: ``ProgramEnv`` episodes whose programs make ``--calls`` chat-completions calls each over HTTP, every
  call extending the last (the token-exact extension path: the previous ids + a user delta).

``--episodes`` run at once (256 by default). The programs are asyncio clients (aiohttp, keep-alive) in one separate
load process, so the run's process CPU is the endpoint's and the engine's work, not the clients'; a real program runs
in a process of its own per episode (its start and its imports are its own cost, not measured here). Figures: CPU ms
of the run's process per call and calls/s (wall), for both, and the ratios. ``--harness N`` adds the episodes/s of
real harnesses (a plain ``openai`` call, a smolagents ``ToolCallingAgent``), each episode in its own process. Run it
on a quiet machine; on a shared one the wall figures move with the load, the CPU figures much less.

    PYTHONPATH=. python scripts/benchmark_program_endpoint.py            # 256 episodes x 8 calls, about a minute
    PYTHONPATH=. python scripts/benchmark_program_endpoint.py --episodes 64 --calls 4
    PYTHONPATH=. python scripts/benchmark_program_endpoint.py --harness 8   # and 8 episodes of each real harness
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# -- the load process: every program's client ------------------------------------------------------------------------
def client_main() -> None:
    import aiohttp

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    lock = threading.Lock()
    holder: dict[str, Any] = {}

    async def session() -> aiohttp.ClientSession:
        if "s" not in holder:
            holder["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return holder["s"]

    async def episode(base_url: str, key: str, model: str, calls: int) -> None:
        http = await session()
        messages = [{"role": "user", "content": "start"}]
        for _ in range(calls):
            body = {"model": model, "messages": messages, "max_tokens": 16}
            async with http.post(
                f"{base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                answer = await r.json()
                assert r.status == 200, answer
            content = answer["choices"][0]["message"]["content"]
            messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "more"}]

    def done(key: str, future: Any) -> None:
        error = future.exception()
        with lock:
            print(json.dumps({"key": key, "error": None if error is None else repr(error)}), flush=True)

    for line in sys.stdin:
        job = json.loads(line)
        if job.get("quit"):
            break
        future = asyncio.run_coroutine_threadsafe(
            episode(job["base_url"], job["key"], job["model"], job["calls"]), loop
        )
        future.add_done_callback(lambda f, key=job["key"]: done(key, f))
    if "s" in holder:
        asyncio.run_coroutine_threadsafe(holder["s"].close(), loop).result(10)
    print(json.dumps({"cpu": time.process_time()}), flush=True)


# -- real harnesses, each episode in a process of its own (--harness N) ------------------------------------------------
def openai_program(endpoint: Any, task: dict) -> str:
    import openai

    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
    r = client.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": "2 + 3?"}])
    return r.choices[0].message.content or ""


def smolagents_program(endpoint: Any, task: dict) -> str:
    from smolagents import OpenAIServerModel, ToolCallingAgent

    model = OpenAIServerModel(model_id=endpoint.model, api_base=endpoint.base_url, api_key=endpoint.api_key)
    return str(ToolCallingAgent(tools=[], model=model, max_steps=2, verbosity_level=0).run("2 + 3?"))


def harnesses(n: int, tokenizer: Any, agent_class: Any) -> None:
    """``n`` episodes at once of each harness (one model call each: a final answer), their processes included."""
    from hf_rollouts.envs.program import ProgramEnv

    agent = agent_class('<tool_call>\n{"name": "final_answer", "arguments": {"answer": "5"}}\n</tool_call>')
    print(f"\n{n} episodes at once of each real harness, one process per episode (start and imports included):")
    for name in ("openai_program", "smolagents_program"):
        env = ProgramEnv(tokenizer, {"program": f"benchmark_program_endpoint:{name}", "verifier": "exact"})
        cpu, wall = time.process_time(), time.perf_counter()
        out = env.run_trial([{"answer": "5"}] * n, agent, 1, max_concurrency=n)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert set(out["statuses"]) == {"done"}, out["errors"]
        print(
            f"  {name:20} {n / wall:6.2f} episodes/s  ({wall:.1f} s wall; "
            f"the run's process {1000 * cpu / n:.0f} ms CPU each)"
        )


# -- the run ---------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--harness", type=int, default=0, help="Also N episodes of each real harness (smolagents).")
    args = parser.parse_args()

    from hf_rollouts.agents.base import Agent
    from hf_rollouts.aio import ENGINE_LOOP
    from hf_rollouts.envs.base import MultistepEnv
    from hf_rollouts.envs.program import ProgramEnv
    from hf_rollouts.rollout.endpoint import ProgramOutcome
    from hf_rollouts.tiny_model import build_tiny_model
    from hf_rollouts.types import Action

    _, tokenizer = build_tiny_model(seed=0)
    end = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else 0

    class Instant(Agent):
        """Answers every request at once with the same ids (per request, as an inference server does)."""

        answers_per_request = True

        def __init__(self, text: str = "fine, go on") -> None:
            self.text, self.ids = text, [*tokenizer.encode(text, add_special_tokens=False), end]

        def get_action(self, messages: Any, agent_state: Any = None) -> Any:  # pragma: no cover
            raise NotImplementedError

        async def answer(self, request: Any) -> Any:
            return Action(text=self.text, token_ids=self.ids, logprobs=[-0.1] * len(self.ids)), None

    class Turns(MultistepEnv):
        """The direct path: ``calls`` agent turns, each answered by a user message."""

        def _initialize_episode(self, session_id: str, task_data: dict) -> dict:
            return {}

        def _format_prompt(self, state: Any, step: int) -> str:
            return "start" if step == 0 else "more"

        def _step_episode(self, session_id: str, state: Any, action: str) -> Any:
            return state, 0.0, False, {}

    class Loaded:
        """The load process and the episodes waiting for it."""

        def __init__(self) -> None:
            cmd = [sys.executable, __file__, "--client"]
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
            self.waiting: dict[str, Any] = {}
            self.cpu: float | None = None
            self.loop = ENGINE_LOOP.loop()
            threading.Thread(target=self._read, daemon=True).start()

        def _read(self) -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                msg = json.loads(line)
                if "cpu" in msg:
                    self.cpu = msg["cpu"]
                    continue
                future = self.waiting.pop(msg["key"])
                self.loop.call_soon_threadsafe(future.set_result, msg["error"])

        async def run(self, address: Any, calls: int) -> ProgramOutcome:
            future = self.waiting[address.api_key] = asyncio.get_running_loop().create_future()
            job = {"base_url": address.base_url, "key": address.api_key, "model": address.model, "calls": calls}
            self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            error = await future
            return ProgramOutcome(result=1.0) if error is None else ProgramOutcome(error=error)

        def close(self) -> float:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(30)
            time.sleep(0.2)
            return self.cpu or float("nan")

    load = Loaded()

    class Benchmarked(ProgramEnv):
        def launch(self, address: Any, task_data: dict) -> Any:
            return load.run(address, args.calls)

    agent = Instant()
    tasks = [{"i": i} for i in range(args.episodes)]
    direct_env = Turns(tokenizer, {"max_turns": args.calls})
    program_env = Benchmarked(tokenizer, {"program": "benchmark:unused", "max_turns": args.calls})

    def timed(env: MultistepEnv) -> tuple[float, float, list]:
        cpu, wall = time.process_time(), time.perf_counter()
        out = env.run_trial(tasks, agent, 1, max_concurrency=args.episodes)
        return time.process_time() - cpu, time.perf_counter() - wall, out["statuses"]

    timed(direct_env)  # warm-up: the engine loop, the template's renders, the server's start
    program_env.run_trial(tasks[:8], agent, 1)
    n = args.episodes * args.calls
    d_cpu, d_wall, d_status = timed(direct_env)
    p_cpu, p_wall, p_status = timed(program_env)
    client_cpu = load.close()
    assert set(d_status) == {"truncated"} and set(p_status) == {"done"}, (set(d_status), set(p_status))

    print(f"{args.episodes} episodes at once x {args.calls} calls = {n} calls each way, instant agent (per request)")
    print(f"{'':10} {'CPU ms/call':>12} {'calls/s':>9} {'wall s':>8}")
    print(f"{'direct':10} {1000 * d_cpu / n:12.3f} {n / d_wall:9.0f} {d_wall:8.2f}")
    print(f"{'endpoint':10} {1000 * p_cpu / n:12.3f} {n / p_wall:9.0f} {p_wall:8.2f}")
    print(f"endpoint / direct: CPU per call x{p_cpu / d_cpu:.2f}, calls/s x{d_wall / p_wall:.2f}")
    print(f"endpoint cost over direct: {1000 * (p_cpu - d_cpu) / n:.3f} CPU ms per call")
    print(f"(the clients' own CPU, in their load process: {1000 * (client_cpu or 0) / n:.3f} ms per call, not counted)")
    if args.harness:
        harnesses(args.harness, tokenizer, Instant)


if __name__ == "__main__":
    client_main() if sys.argv[1:] == ["--client"] else main()
