"""The rollout engine against a server with long-tail latency, and its own overhead with an instant agent.

    python scripts/benchmark_endpoint.py            # both parts, default workloads (about a minute)

Part 1 (endpoint): a loopback OpenAI-compatible chat server whose latency per request is log-normal (seeded;
median 0.1 s, long tail) answers Mastermind guesses. The same episodes are played, side by side in one run, by

(i)   hf_rollouts: ``generate_rollouts`` with the endpoint agent (each request sent when its episode makes it);
(ii)  the ideal of independent episodes: every episode its own thread running the plain loop
      (``run_episode`` with the agent's ``act``), nothing shared;
(iii) the old lockstep engine: the same agent forced to batch on the client (every turn waits for the
      slowest request of the map batch, every map batch for its slowest episode).

Part 2 (instant agent): a trivial env and an agent that answers at once, so only the machinery is timed:
the plain sequential loop (``run_episode`` one after the other) against ``generate_rollouts`` (Dataset.map,
padding, Arrow shards) at batch_size 16 and 64. Each side is timed at 1 and 2 torch threads, best of each.

Part 3 (envs that wait): the trivial env with ``_initialize_episode`` and ``_step_episode`` each waiting 50 ms,
as sync hooks (``time.sleep``, on the engine's worker pool) and as ``async def`` hooks (``asyncio.sleep``, on the
engine's loop), with the instant agent: the serial sum of hook time, the wall time, and the ideal (for the pool
width: every phase's waits spread over the pool; for async: one wait per phase), side by side; then Twenty
Questions with its LLM gamemaster answering over HTTP, at env_workers 1 and the default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import disable_progress_bars

from hf_rollouts import MultistepEnv
from hf_rollouts.agents.base import Agent
from hf_rollouts.agents.openai import OpenAIChatAgent
from hf_rollouts.agents.sampling import SamplingConfig
from hf_rollouts.agents.scripted import ScriptedAgent
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.rollout import episode_jobs, run_episode, run_episodes
from hf_rollouts.schema import to_task_dataset
from hf_rollouts.seeding import derive_seed
from hf_rollouts.tiny_model import build_tokenizer
from hf_rollouts.types import Action


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=48)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--median", type=float, default=0.1, help="median latency, seconds")
    p.add_argument("--sigma", type=float, default=0.8, help="log-normal sigma of the latency (the tail)")
    p.add_argument("--batch-size", type=int, default=16, help="generate_rollouts batch_size for (i) and (iii)")
    p.add_argument("--instant-tasks", type=int, default=2000)
    p.add_argument("--skip-endpoint", action="store_true")
    p.add_argument("--skip-instant", action="store_true")
    p.add_argument("--skip-waiting", action="store_true")
    p.add_argument("--waiting-tasks", type=int, default=16, help="part 3: tasks (x 4 rollouts) of the waiting envs")
    p.add_argument("--hook-delay", type=float, default=0.05, help="part 3: seconds each waiting hook waits")
    p.add_argument("--env-workers", type=int, default=None, help="part 3: the pool width (default: the library's)")
    return p.parse_args()


# -- part 1: a loopback server with seeded long-tail latency ---------------------------------------------
class LatencyServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode may connect at once

    def __init__(self, median: float, sigma: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.median, self.sigma = median, sigma

    def latency(self, body: dict) -> float:
        """Seeded by the request (its per-request seed and messages), so every run sees the same latencies."""
        rng = random.Random(f"{body.get('seed')}|{len(body.get('messages', []))}")
        return self.median * rng.lognormvariate(0.0, self.sigma)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.server.latency(body))
        rng = random.Random(f"{body.get('seed')}|guess")
        guess = " ".join(str(rng.randint(1, 6)) for _ in range(4))
        answer = {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": guess}, "finish_reason": "stop"}],
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Lockstep(Agent):
    """The old engine's behaviour: the endpoint agent batched on the client (lockstep turns and map batches)."""

    def __init__(self, inner: OpenAIChatAgent) -> None:
        self.inner, self.tokenizer = inner, inner.tokenizer

    def get_action(self, messages, agent_state=None):  # pragma: no cover - act_batch is used
        raise NotImplementedError

    def act_batch(self, requests):
        return self.inner.act_batch(requests)

    def set_seed(self, seed: int) -> None:
        self.inner.set_seed(seed)

    def fingerprint(self):
        return {"lockstep": self.inner.fingerprint()}


def endpoint_part(args, tokenizer) -> None:
    env_config = {"max_turns": args.turns, "num_symbols": 6}
    tasks = MastermindEnv(tokenizer, env_config).get_train_dataset(args.tasks)
    episodes = args.tasks * args.rollouts
    server = LatencyServer(args.median, args.sigma)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def agent() -> OpenAIChatAgent:
        return OpenAIChatAgent(
            base_url=server.url, model="m", mode="chat", tokenizer=tokenizer, concurrency=episodes,
            sampling=SamplingConfig(max_new_tokens=16), max_retries=0, timeout=60,
        )  # fmt: skip

    print(
        f"endpoint: Mastermind, {args.tasks} tasks x {args.rollouts} rollouts = {episodes} episodes, <= {args.turns} "
        f"turns; latency log-normal, median {args.median} s, sigma {args.sigma}; batch_size {args.batch_size}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        common = dict(tokenizer=tokenizer, progress=False, seed=0, batch_size=args.batch_size, cache_dir=cache)
        t = time.perf_counter()
        a = agent()
        out = generate_rollouts(tasks, a, args.rollouts, load_from_cache_file=False, **common)
        errors_i = sum(s == "error" for row in out["statuses"] for s in row)
        rows.append(("(i) hf_rollouts generate_rollouts", time.perf_counter() - t, a.stats["requests"], errors_i))

        b = agent()
        env = MastermindEnv(tokenizer, env_config)
        results: list = [None] * episodes

        def play(k: int) -> None:
            row, r = divmod(k, args.rollouts)
            session, seed = f"row{row}/task0/rollout{r}", derive_seed(derive_seed(0, row), 0, r)  # (i)'s seeds
            results[k] = run_episode(env, session, b, json.loads(tasks[row]["task_data"]), seed=seed)

        t = time.perf_counter()
        threads = [threading.Thread(target=play, args=(k,)) for k in range(episodes)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        errors_ii = sum(e.status == "error" for e in results)
        rows.append(
            ("(ii) ideal: a thread per episode, no sharing", time.perf_counter() - t, b.stats["requests"], errors_ii)
        )

        c = Lockstep(agent())
        t = time.perf_counter()
        out = generate_rollouts(tasks, c, args.rollouts, load_from_cache_file=False, **common)
        errors_iii = sum(s == "error" for row in out["statuses"] for s in row)
        rows.append(("(iii) old lockstep engine", time.perf_counter() - t, c.inner.stats["requests"], errors_iii))
    server.shutdown()
    print("| run | wall s | episodes/s | requests | errors |\n|---|---:|---:|---:|---:|")
    for label, seconds, requests, errors in rows:
        print(f"| {label} | {seconds:.2f} | {episodes / seconds:.1f} | {requests} | {errors} |")
    print(f"(i)/(ii) = {rows[0][1] / rows[1][1]:.3f}   (iii)/(i) = {rows[2][1] / rows[0][1]:.2f}")


# -- part 2: an instant agent and a trivial env ----------------------------------------------------------
class Counter(MultistepEnv):
    """Four turns, then done; no parsing, no game."""

    def _initialize_episode(self, session_id, task_data):
        return {"n": 0}

    def _format_prompt(self, state, step):
        return "go"

    def _step_episode(self, session_id, state, action):
        state["n"] += 1
        return state, 1.0 if state["n"] == 4 else 0.0, state["n"] == 4, {}


class Instant(Agent):
    """Answers at once with fixed ids (a token-level agent: no tokenization of its answers)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.ids = tokenizer, tokenizer("ok", add_special_tokens=False)["input_ids"]

    def get_action(self, messages, agent_state=None):
        return Action(text="ok", token_ids=self.ids), agent_state

    def act(self, request):
        return Action(text="ok", token_ids=self.ids), request.agent_state

    def act_batch(self, requests):
        return [(Action(text="ok", token_ids=self.ids), r.agent_state) for r in requests]

    def fingerprint(self):
        return {"instant": True}


def _best_interleaved(runs: dict, threads=(1, 2), repeats=3) -> dict:
    """Best wall time (and its torch thread count) of each run; the runs take turns, so drift of a noisy
    machine hits every side alike."""
    best = {name: (float("inf"), 0) for name in runs}
    for _ in range(repeats):
        for n in threads:
            torch.set_num_threads(n)
            for name, fn in runs.items():
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], (time.perf_counter() - t, n))
    return best


def instant_part(args, tokenizer) -> None:
    path = f"{Counter.__module__}.{Counter.__qualname__}"
    rows = [
        {"env_class_path": path, "env_config": {"max_turns": 4}, "task_data": {"i": i}}
        for i in range(args.instant_tasks)
    ]
    tasks = to_task_dataset(rows)
    rollouts, episodes = 4, args.instant_tasks * 4
    env, agent = Counter(tokenizer, {"max_turns": 4}), Instant(tokenizer)

    def plain() -> None:
        for i in range(args.instant_tasks):
            for r in range(rollouts):
                run_episode(env, f"t{i}/r{r}", agent, {"i": i})

    def engine(batch_size: int):
        def run() -> None:
            with tempfile.TemporaryDirectory() as cache:
                generate_rollouts(
                    tasks, agent, rollouts, tokenizer=tokenizer, batch_size=batch_size, progress=False, cache_dir=cache,
                    allowed_env_modules=[Counter.__module__],
                )  # fmt: skip

        return run

    print(f"\ninstant agent: {args.instant_tasks} tasks x {rollouts} rollouts x 4 turns = {episodes} episodes")
    best = _best_interleaved({"plain": plain, 16: engine(16), 64: engine(64)})
    t_plain, n_plain = best["plain"]
    print("| run | wall s | episodes/s | torch threads |\n|---|---:|---:|---:|")
    print(f"| plain sequential loop | {t_plain:.2f} | {episodes / t_plain:.0f} | {n_plain} |")
    for bs in (16, 64):
        t, n = best[bs]
        print(f"| generate_rollouts, batch_size {bs} | {t:.2f} | {episodes / t:.0f} | {n} |")
    for bs in (16, 64):
        print(f"engine / plain loop at batch_size {bs}: {t_plain / best[bs][0]:.0%} of the plain loop's episodes/s")


# -- part 3: env hooks that wait (I/O-bound environments) ------------------------------------------------
class _Waits:
    """Shared by both waiting envs: every wait is added to ``waited`` (the serial sum of hook time)."""

    delay = 0.05
    waited = 0.0
    lock = threading.Lock()

    @classmethod
    def add(cls, seconds: float) -> None:
        with cls.lock:
            cls.waited += seconds


class SleepyCounter(Counter):
    """Counter whose ``_initialize_episode`` and ``_step_episode`` each wait ``delay`` seconds (``time.sleep``,
    standing for I/O: an env server, a sandbox, a judge)."""

    def _initialize_episode(self, session_id, task_data):
        t = time.perf_counter()
        time.sleep(_Waits.delay)
        _Waits.add(time.perf_counter() - t)
        return super()._initialize_episode(session_id, task_data)

    def _step_episode(self, session_id, state, action):
        t = time.perf_counter()
        time.sleep(_Waits.delay)
        _Waits.add(time.perf_counter() - t)
        return super()._step_episode(session_id, state, action)


class AsyncSleepyCounter(Counter):
    """The same env with ``async def`` hooks (``asyncio.sleep``)."""

    async def _initialize_episode(self, session_id, task_data):
        t = time.perf_counter()
        await asyncio.sleep(_Waits.delay)
        _Waits.add(time.perf_counter() - t)
        return Counter._initialize_episode(self, session_id, task_data)

    async def _step_episode(self, session_id, state, action):
        t = time.perf_counter()
        await asyncio.sleep(_Waits.delay)
        _Waits.add(time.perf_counter() - t)
        return Counter._step_episode(self, session_id, state, action)


class _YesServer(LatencyServer):
    """A gamemaster endpoint: answers every question "No" after a fixed latency."""

    def __init__(self, latency: float) -> None:
        ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), _YesHandler)
        self.fixed = latency


class _YesHandler(_Handler):
    wbufsize = -1  # one send per answer: headers and body in separate small sends meet the client's delayed ACK

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.server.fixed)
        message = {"role": "assistant", "content": "No"}
        answer = {"id": "x", "object": "chat.completion", "model": body.get("model", "m"),
                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def waiting_part(args, tokenizer) -> None:
    from hf_rollouts.envs.twenty_questions import TwentyQuestionsEnv
    from hf_rollouts.rollout import DEFAULT_ENV_WORKERS

    tasks_n, rollouts, turns, d = args.waiting_tasks, 4, 4, args.hook_delay
    episodes, phases = tasks_n * rollouts, turns + 1  # _initialize_episode, then one _step_episode per turn
    _Waits.delay = d
    agent = Instant(tokenizer)
    width = args.env_workers or DEFAULT_ENV_WORKERS
    print(
        f"\nenv hooks that wait: {tasks_n} tasks x {rollouts} rollouts = {episodes} episodes x {turns} turns; "
        f"_initialize_episode and _step_episode each wait {d * 1000:.0f} ms; instant agent; env_workers {width}"
    )
    print("| env | serial hook time s | wall s | ideal s | wall / ideal | serial / wall |")
    print("|---|---:|---:|---:|---:|---:|")
    runs = [
        (f"sync hooks (time.sleep), pool of {width}", SleepyCounter, phases * math.ceil(episodes / width) * d),
        ("async hooks (asyncio.sleep), event loop", AsyncSleepyCounter, phases * d),
        ("sync hooks, env_workers 1 (serial)", SleepyCounter, phases * episodes * d),
    ]
    for label, cls, ideal in runs:
        env = cls(tokenizer, {"max_turns": turns})
        jobs = episode_jobs(env, [{"i": i} for i in range(tasks_n)], rollouts)
        _Waits.waited = 0.0
        workers = 1 if "serial" in label else width
        t = time.perf_counter()
        out = run_episodes(jobs, agent, env_workers=workers)
        wall = time.perf_counter() - t
        assert all(e["status"] == "done" for e in out), {e["error"] for e in out}
        serial = _Waits.waited
        print(f"| {label} | {serial:.2f} | {wall:.2f} | {ideal:.2f} | {wall / ideal:.2f} | {serial / wall:.1f}x |")

    # The LLM gamemaster of Twenty Questions, unchanged: its answers come from an endpoint with fixed latency.
    server = _YesServer(d)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = f"openai:{server.url}#m"
    config = {"max_turns": turns, "gamemaster": "agent", "gamemaster_model": spec}
    env = TwentyQuestionsEnv(tokenizer, config)
    tq = [json.loads(t) for t in env.get_train_dataset(tasks_n)["task_data"]]
    asker = ScriptedAgent(["Is it alive?"])
    print(
        f"\nTwenty Questions, LLM gamemaster over HTTP ({d * 1000:.0f} ms per answer), "
        f"{episodes} episodes x {turns} questions"
    )
    print("| env_workers | wall s | questions answered |\n|---:|---:|---:|")
    for workers in (1, width):
        before = env.gamemaster.agent.stats["requests"]
        t = time.perf_counter()
        out = run_episodes(episode_jobs(env, tq, rollouts), asker, env_workers=workers)
        wall = time.perf_counter() - t
        assert all(e["status"] in ("done", "truncated") for e in out), {e["error"] for e in out}
        print(f"| {workers} | {wall:.2f} | {env.gamemaster.agent.stats['requests'] - before} |")
    server.shutdown()


def main() -> int:
    args = parse_args()
    disable_progress_bars()
    tokenizer = build_tokenizer()
    if not args.skip_endpoint:
        endpoint_part(args, tokenizer)
    if not args.skip_instant:
        instant_part(args, tokenizer)
    if not args.skip_waiting:
        waiting_part(args, tokenizer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
