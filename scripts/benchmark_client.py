"""The OpenAI-compatible client against a server in its own process: its ceiling, its CPU per request, its wall time
against the ideal.

    python scripts/benchmark_client.py                               # this tree, the default grid
    python scripts/benchmark_client.py --trees /work/main . --rounds 3   # two trees side by side, rounds alternating

**The server** (``--serve``, started here as a subprocess of its own) is a loopback OpenAI-compatible server on
asyncio, one thread, that answers Mastermind guesses in **chat** mode (``/v1/chat/completions``: text) and in
**token** mode (``/v1/completions`` with prompt ids: sampled ids, log-probs and the prompt ids echoed, as vLLM
does). Under ``/instant/v1`` it answers at once; under ``/latency/v1`` after a seeded log-normal latency (median
``--median`` 0.1 s, sigma ``--sigma`` 0.8), keyed by the request's seed, so both modes and every tree see the same
latencies. The negotiation probe (``max_tokens`` 1) is answered at once.

**The client** is what a user runs: ``generate_rollouts`` with an :class:`OpenAIChatAgent` at ``concurrency`` N (N
episodes alive at once; at least N episodes: ``--tasks`` grows to N / ``--rollouts``), in a process of its own per
tree (``PYTHONPATH`` = the tree, so ``--trees /work/main .`` compares main with this tree), for every combination of
server (``instant``, ``latency``), mode (``chat``, ``tokens``) and concurrency (16, 192, 1024). It reports

* **requests/s**: against the instant server, the client's ceiling;
* **CPU per request**: the client process's CPU time (user + system, every thread) during the run, / requests;
* **wall / ideal** against the latency server. The ideal is what a client without overhead would take, computed by
  the server from what it served: each request is chained to the answer its prompt extends (its episode's previous
  turn), and the ideal is the longest chain of latencies, or, with fewer slots than episodes, the sum of all
  latencies / concurrency when that is longer (a lower bound). ``chains`` should equal the episodes.

``--http-only`` times the agent's HTTP client alone (``JSONClient``: no engine, env or dataset), as many episodes of
``--turns`` POSTs each, every prompt extending the previous answer, so the same ideal applies.

Every side runs ``--rounds`` times (concurrency 1024: ``--big-rounds``), the trees taking turns (ABBA), and its best
is printed with the spread. Everything stays on 127.0.0.1; each run is bounded (the agent's deadline, ``--timeout``,
and no retries: an error is counted, never hidden), and the server exits with this script (its stdin closes) or
after ``--server-lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SCRIPT = Path(__file__).resolve()
RESULT = "RESULT "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs="+", default=[str(SCRIPT.parents[1])], help="repository roots to compare")
    p.add_argument("--servers", default="instant,latency")
    p.add_argument("--modes", default="chat,tokens")
    p.add_argument("--concurrency", default="16,192,1024")
    p.add_argument("--tasks", type=int, default=48)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--big-rounds", type=int, default=1, help="rounds at concurrency >= 1024")
    p.add_argument("--median", type=float, default=0.1, help="latency server: median seconds")
    p.add_argument("--sigma", type=float, default=0.8, help="latency server: log-normal sigma")
    p.add_argument("--timeout", type=float, default=60.0, help="the agent's deadline per request, seconds")
    p.add_argument("--server-lifetime", type=float, default=3600.0)
    p.add_argument(
        "--http-only", action="store_true", help="the HTTP layer alone: episodes of --turns POSTs, no engine"
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--guesses", help=argparse.SUPPRESS)
    p.add_argument("--client", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _guess(seed: object) -> str:
    rng = random.Random(f"{seed}|guess")
    return " ".join(str(rng.randint(1, 6)) for _ in range(4))


# -- the server (its own process) ------------------------------------------------------------------------------
class Server:
    """Answers, and the log of the latency requests the ideal is computed from."""

    def __init__(self, median: float, sigma: float, guess_ids: dict[str, list[int]]) -> None:
        self.median, self.sigma, self.guess_ids = median, sigma, guess_ids
        self.log: list[tuple[tuple, tuple, float]] = []
        self.requests = self.connections = 0  # connections: those that carried a request
        self.cpu0 = _cpu()

    def answer(self, path: str, body: dict) -> tuple[float, dict]:
        self.requests += 1
        seed, probe = body.get("seed"), body.get("max_tokens") == 1
        guess = _guess(seed)
        delay = 0.0
        if path.startswith("/latency/") and not probe:
            delay = self.median * random.Random(f"{seed}|latency").lognormvariate(0.0, self.sigma)
        if path.endswith("/chat/completions"):
            seq = tuple((m.get("role"), m.get("content")) for m in body.get("messages", []))
            answered = seq + (("assistant", guess),)
            message = {"role": "assistant", "content": guess}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
        else:
            prompt = body.get("prompt") or []
            ids = (self.guess_ids[guess] + list(body.get("stop_token_ids") or [])[:1])[: body.get("max_tokens") or 16]
            seq, answered = tuple(prompt), tuple(prompt) + tuple(ids)
            logprobs = {"token_logprobs": [-0.5] * len(ids)}
            choice = {"index": 0, "text": guess, "token_ids": ids, "prompt_token_ids": prompt, "logprobs": logprobs,
                      "finish_reason": "stop"}  # fmt: skip
        if delay:
            self.log.append((seq, answered, delay))
        return delay, {"id": "x", "object": "completion", "model": body.get("model", "m"), "choices": [choice]}

    def stats(self, concurrency: int) -> dict:
        """The ideal of the latency requests since the last call (see the module docstring), then a fresh log."""
        by_len: dict[int, dict[tuple, list[float]]] = {}  # answered sequences (two episodes may share one: a list)
        longest, chains, total = 0.0, 0, 0.0
        for seq, answered, latency in self.log:
            before = None
            for n in sorted((n for n in by_len if n < len(seq)), reverse=True):
                waiting = by_len[n].get(seq[:n])
                if waiting:
                    before = waiting.pop(0)
                    break
            chains += before is None
            done = (before or 0.0) + latency
            by_len.setdefault(len(answered), {}).setdefault(answered, []).append(done)
            longest, total = max(longest, done), total + latency
        ideal = max(longest, total / max(1, concurrency)) if self.log else 0.0
        cpu, self.cpu0 = self.cpu0, _cpu()
        out = {"server_requests": self.requests, "server_cpu": self.cpu0 - cpu, "ideal": ideal, "chains": chains,
               "latency_sum": total, "connections": self.connections}  # fmt: skip
        self.log, self.requests, self.connections = [], 0, 0
        return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _Protocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection (what the client sends)."""

    def __init__(self, server: Server) -> None:
        self.server, self.buf, self.transport, self.used = server, bytearray(), None, False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            method, path = lines[0].split(" ")[:2]
            if method == "GET" and path.startswith("/stats"):
                concurrency = int(path.rpartition("=")[2]) if "=" in path else 1
                self._send(0.0, self.server.stats(concurrency))
            else:
                self.server.connections += not self.used
                self.used = True
                self._send(*self.server.answer(path, json.loads(body)))

    def _send(self, delay: float, answer: dict) -> None:
        data = json.dumps(answer).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
        if delay:
            asyncio.get_running_loop().call_later(delay, self._write, head + data)
        else:
            self._write(head + data)

    def _write(self, data: bytes) -> None:
        if not self.transport.is_closing():
            self.transport.write(data)


async def _serve(args: argparse.Namespace) -> None:
    guess_ids = json.loads(Path(args.guesses).read_text())
    server = Server(args.median, args.sigma, guess_ids)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: _Protocol(server), "127.0.0.1", 0, backlog=4096)
    print(f"port {listener.sockets[0].getsockname()[1]}", flush=True)
    stop = loop.create_future()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.done() or (os.read(sys.stdin.fileno(), 1) or stop.set_result(0)))
    loop.call_later(args.server_lifetime, lambda: stop.done() or stop.set_result(0))
    await stop
    listener.close()


# -- the client (a process of its own per tree) ----------------------------------------------------------------
def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - 127.0.0.1 only
        return json.loads(response.read())


def client(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datasets import disable_progress_bars

    from hf_rollouts.agents.openai import OpenAIChatAgent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.tiny_model import build_tokenizer

    disable_progress_bars()
    spec = json.loads(args.client)
    tokenizer = build_tokenizer()
    for run in spec["runs"]:
        if spec.get("http_only"):
            print(RESULT + json.dumps(http_only(spec, run)), flush=True)
            continue
        c, rollouts = run["concurrency"], spec["rollouts"]
        tasks_n = max(spec["tasks"], math.ceil(c / rollouts))
        env_config = {"max_turns": spec["turns"], "num_symbols": 6}
        tasks = MastermindEnv(tokenizer, env_config).get_train_dataset(tasks_n)
        root = f"{spec['url']}/{run['server']}"
        agent = OpenAIChatAgent(
            base_url=f"{root}/v1", model="m", mode=run["mode"], tokenizer=tokenizer, concurrency=c,
            sampling=SamplingConfig(max_new_tokens=16), max_retries=0, timeout=spec["timeout"],
        )  # fmt: skip
        _get(f"{spec['url']}/stats")  # a fresh log
        with tempfile.TemporaryDirectory() as cache:
            cpu, t = _cpu(), time.perf_counter()
            out = generate_rollouts(
                tasks, agent, rollouts, tokenizer=tokenizer, progress=False, seed=0, batch_size=16, cache_dir=cache,
                load_from_cache_file=False,
            )  # fmt: skip
            wall, cpu = time.perf_counter() - t, _cpu() - cpu
        agent.close()
        errors = [e for row in out["errors"] for e in row if e] if "errors" in out.column_names else []
        statuses = [s for row in out["statuses"] for s in row]
        result = dict(run, tree=spec["tree"], episodes=len(statuses), requests=agent.stats["requests"], wall=wall,
                      cpu=cpu, errors=sum(s == "error" for s in statuses), first_error=(errors or [""])[0][:300],
                      retries=agent.stats["retries"], **_get(f"{spec['url']}/stats?concurrency={c}"))  # fmt: skip
        print(RESULT + json.dumps(result), flush=True)


def http_only(spec: dict, run: dict) -> dict:
    """``--http-only``: the agent's HTTP client (``JSONClient``) alone, no engine, env or dataset: as many episodes as
    the normal run, ``concurrency`` alive, each ``turns`` POSTs whose prompts extend the previous answer."""
    from hf_rollouts.agents.openai import OpenAISettings
    from hf_rollouts.agents.openai.http import JSONClient

    c, turns = run["concurrency"], spec["turns"]
    episodes = max(spec["tasks"] * spec["rollouts"], c)
    root = f"{spec['url']}/{run['server']}/v1"
    settings = OpenAISettings(base_url=root, model="m", concurrency=c, max_retries=0, timeout=spec["timeout"])
    chat = run["mode"] == "chat"
    url = root + ("/chat/completions" if chat else "/completions")
    errors: list[str] = []

    async def play() -> None:
        client, slots = JSONClient(settings, None, lambda key, n=1: None), asyncio.Semaphore(c)

        async def episode(e: int) -> None:
            seq: list = [{"role": "user", "content": f"start {e}"}] if chat else [1, 2, 3, 4 + e % 500]
            async with slots:
                for t in range(turns):
                    body = {"model": "m", "seed": e * 1000 + t, "max_tokens": 16}
                    body.update({"messages": seq} if chat else {"prompt": seq, "stop_token_ids": [0]})
                    try:
                        answer = (await client.post(url, body))["choices"][0]
                    except Exception as exc:  # counted, never hidden
                        errors.append(str(exc))
                        return
                    said = {"role": "assistant", "content": answer["message"]["content"]} if chat else None
                    seq = seq + ([said, {"role": "user", "content": "again"}] if chat else answer["token_ids"] + [5, 6])

        await asyncio.gather(*(episode(e) for e in range(episodes)))
        await client.close()

    _get(f"{spec['url']}/stats")
    cpu, t = _cpu(), time.perf_counter()
    asyncio.run(play())
    wall, cpu = time.perf_counter() - t, _cpu() - cpu
    stats = _get(f"{spec['url']}/stats?concurrency={c}")
    return dict(run, tree=spec["tree"], episodes=episodes, requests=stats["server_requests"], wall=wall, cpu=cpu,
                errors=len(errors), first_error=(errors or [""])[0][:300], retries=0, **stats)  # fmt: skip


# -- the orchestration -------------------------------------------------------------------------------------------
def start_server(args: argparse.Namespace, guesses: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(SCRIPT), "--serve", "--guesses", guesses, "--median", str(args.median),
           "--sigma", str(args.sigma), "--server-lifetime", str(args.server_lifetime)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "port":
        proc.kill()
        raise RuntimeError(f"the server did not start: {line}")
    return proc, f"http://127.0.0.1:{line[1]}"


def run_client(args: argparse.Namespace, tree: str, url: str, runs: list[dict]) -> list[dict]:
    spec = {"url": url, "tree": tree, "runs": runs, "tasks": args.tasks, "rollouts": args.rollouts,
            "turns": args.turns, "timeout": args.timeout, "http_only": args.http_only}  # fmt: skip
    path = os.pathsep.join(p for p in (str(Path(tree).resolve()), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, str(SCRIPT), "--client", json.dumps(spec)]
    budget = args.timeout * 4 + 600  # bounded whatever happens
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget, cwd=tree)
    results = [json.loads(line[len(RESULT) :]) for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or len(results) != len(runs):
        raise RuntimeError(f"the client in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return results


def guess_table(path: str) -> None:
    from hf_rollouts.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    guesses = [" ".join(g) for g in _product("123456", 4)]
    table = {g: tokenizer(g, add_special_tokens=False)["input_ids"] for g in guesses}
    Path(path).write_text(json.dumps(table))


def _product(symbols: str, n: int) -> list[tuple[str, ...]]:
    import itertools

    return list(itertools.product(symbols, repeat=n))


def report(args: argparse.Namespace, results: list[dict]) -> None:
    keys = sorted({(r["server"], r["mode"], r["concurrency"]) for r in results}, key=lambda k: (k[0], k[2], k[1]))
    print("| server | mode | concurrency | tree | requests | requests/s (best; all) | client CPU ms/request (best; "
          "all) | server CPU ms/request | wall s | ideal s | wall / ideal (best) | chains | errors |")  # fmt: skip
    print("|---|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    best: dict = {}
    for key in keys:
        for tree in args.trees:
            rs = [r for r in results if (r["server"], r["mode"], r["concurrency"]) == key and r["tree"] == tree]
            if not rs:
                continue
            rps = sorted((r["requests"] / r["wall"] for r in rs), reverse=True)
            cpu = sorted(1000 * r["cpu"] / r["requests"] for r in rs)
            top = min(rs, key=lambda r: r["wall"])
            ratio = f"{top['wall'] / top['ideal']:.3f}" if top["ideal"] else "-"
            ideal = f"{top['ideal']:.2f}" if top["ideal"] else "-"
            server_cpu = 1000 * top["server_cpu"] / max(1, top["server_requests"])
            print(f"| {key[0]} | {key[1]} | {key[2]} | {tree} | {top['requests']} | {rps[0]:.0f}; "
                  f"{', '.join(f'{x:.0f}' for x in rps)} | {cpu[0]:.2f}; {', '.join(f'{x:.2f}' for x in cpu)} | "
                  f"{server_cpu:.2f} | {top['wall']:.2f} | {ideal} | {ratio} | {top['chains']} | "
                  f"{sum(r['errors'] for r in rs)} |")  # fmt: skip
            best[key, tree] = (rps[0], cpu[0], top["wall"])
            for r in rs:
                if r["errors"]:
                    print(f"  errors in {tree}: {r['first_error']}")
    if len(args.trees) == 2:
        old, new = args.trees
        print(f"\nratios {new} / {old} (best of each): requests/s, CPU per request, wall")
        for key in keys:
            if (key, old) in best and (key, new) in best:
                (r0, c0, w0), (r1, c1, w1) = best[key, old], best[key, new]
                print(
                    f"  {key[0]:8s} {key[1]:6s} {key[2]:5d}: {r1 / r0:.2f}x req/s, {c1 / c0:.2f}x CPU, {w1 / w0:.2f}x"
                )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        asyncio.run(_serve(args))
        return 0
    if args.client:
        client(args)
        return 0
    grid = [
        {"server": s, "mode": m, "concurrency": int(c)}
        for c in args.concurrency.split(",")
        for s in args.servers.split(",")
        for m in args.modes.split(",")
    ]
    print(f"load average before: {os.getloadavg()}; trees: {args.trees}", flush=True)
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        guesses = f"{tmp}/guesses.json"
        guess_table(guesses)
        proc, url = start_server(args, guesses)
        try:
            for k in range(max(args.rounds, args.big_rounds)):
                runs = [g for g in grid if k < (args.big_rounds if g["concurrency"] >= 1024 else args.rounds)]
                for tree in args.trees if k % 2 == 0 else args.trees[::-1]:
                    done = run_client(args, tree, url, runs)
                    results += done
                    print(f"round {k + 1}, {tree}: done; load average {os.getloadavg()}", flush=True)
                    for r in done:
                        print(f"  {r['server']} {r['mode']} {r['concurrency']}: {r['requests'] / r['wall']:.0f} req/s, "
                              f"{1000 * r['cpu'] / r['requests']:.2f} ms CPU/request, wall {r['wall']:.2f} s, ideal "
                              f"{r['ideal']:.2f} s, errors {r['errors']}", flush=True)  # fmt: skip
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    report(args, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
