"""OpenAIChatAgent against real HTTP servers on 127.0.0.1.

* a small vLLM-style server (stdlib ``http.server``) that runs the tiny model and
  returns sampled ids, log-probabilities and prompt ids: the token-exact path;
* ``transformers serve`` on the tiny model (skipped without the serving extra):
  a real OpenAI-compatible server that returns text only;
* scripted servers for the failure modes: slow answers, 5xx, 429, 4xx, a
  connection dropped mid-response, nothing listening.

Every server listens on 127.0.0.1 only, every loop and wait is bounded.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hf_rollouts.agents.openai import (
    OpenAIChatAgent,
    OpenAIRequestError,
    OpenAISettings,
    chat_completions_url,
    parse_openai_spec,
)
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.types import AgentRequest

FAST = {"backoff": 0.01, "max_backoff": 0.05}
OK_BODY = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "1 2 3 4"}, "finish_reason": "stop"}]}


# -- loopback servers ------------------------------------------------------------------
class LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1:<free port>, serving ``respond(handler, index, body)`` in a thread."""

    def __init__(self, respond):
        self.respond = respond
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    index = len(server.bodies)
                    server.bodies.append(body)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    server.respond(self, index, body)
                finally:
                    with server._lock:
                        server.in_flight -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def send_json(handler, payload, status=200, headers=None):
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(data)


def drop_mid_response(handler):
    """Promise 1000 bytes, send a few, close the socket."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    handler.wfile.write(b'{"choices": [{"mess')
    handler.wfile.flush()
    handler.close_connection = True
    handler.connection.shutdown(socket.SHUT_RDWR)


def agent_for(server, **kw):
    return OpenAIChatAgent(base_url=server.url, model="test-model", **{**FAST, **kw})


def request(text="Guess the code.", session="s"):
    return AgentRequest(messages=[{"role": "user", "content": text}], prompt_token_ids=[], session_id=session)


# -- a vLLM-style server running the tiny model ----------------------------------------------------------
class TinyModelServer(LoopbackServer):
    """``/v1/chat/completions`` by the tiny model, answering like vLLM with ``return_token_ids``/``logprobs``."""

    def __init__(self, model, tokenizer, *, bad_prompt_ids=False, omit_prompt_ids=False):
        from hf_rollouts.agents.hf import TransformersAgent
        from hf_rollouts.chat import ChatDelta

        self.model_agent = TransformersAgent(model, tokenizer, temperature=1.0, max_new_tokens=10, seed=0)
        self.chat = ChatDelta(tokenizer)
        self.answers: list[dict] = []
        self.bad_prompt_ids = bad_prompt_ids
        self.omit_prompt_ids = omit_prompt_ids
        self._model_lock = threading.Lock()
        super().__init__(self._respond)

    def _respond(self, handler, index, body):
        prompt_ids = self.chat.initial_ids(body["messages"])  # the server renders the chat itself
        with self._model_lock:
            self.model_agent.sampling.max_new_tokens = int(body.get("max_tokens", 10))
            self.model_agent.set_seed(int(body.get("seed", 0)))
            action, _ = self.model_agent.act(AgentRequest(messages=body["messages"], prompt_token_ids=prompt_ids))
            self.answers.append(
                {"seed": body.get("seed"), "ids": action.token_ids, "logprobs": action.logprobs, "prompt": prompt_ids}
            )
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": action.text},
            "finish_reason": "stop" if action.stopped else "length",
        }
        payload = {"id": f"cmpl-{index}", "object": "chat.completion", "model": body["model"], "choices": [choice]}
        if body.get("return_token_ids"):
            choice["token_ids"] = action.token_ids
            if not self.omit_prompt_ids:
                payload["prompt_token_ids"] = [0] + prompt_ids if self.bad_prompt_ids else prompt_ids
        if body.get("logprobs"):
            tokens = self.model_agent.tokenizer.convert_ids_to_tokens(action.token_ids)
            choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, action.logprobs)]}
        send_json(handler, payload)


@pytest.fixture()
def tiny_server(tiny):
    with TinyModelServer(*tiny) as server:
        yield server


def test_token_exact_rollouts_from_a_vllm_style_server(tiny_server, tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 1})
    agent = OpenAIChatAgent(base_url=tiny_server.url, model="tiny", max_tokens=10, tokenizer=tokenizer, concurrency=4)
    out = env.run_trial([{"code": [1, 2, 3, 4]}, {"code": [4, 3, 2, 1]}], agent, num_rollouts=3)
    assert agent.stats["requests"] == 6 and agent.stats["token_exact"] == 6 and agent.stats["text_fallbacks"] == 0
    by_seed = {a["seed"]: a for a in tiny_server.answers}
    bodies = sorted(tiny_server.bodies, key=lambda b: b["seed"])
    assert len({b["seed"] for b in bodies}) == 6  # every rollout gets its own seed: a GRPO group is not 3 copies
    assert all(b["logprobs"] is True and b["return_token_ids"] is True and b["model"] == "tiny" for b in bodies)
    served = sorted((tuple(a["ids"]), tuple(a["logprobs"])) for a in by_seed.values())
    stored = []
    for ids, mask, lps in zip(out["padded_full_token_ids"], out["padded_agent_token_mask"], out["padded_logprobs"]):
        agent_ids = [t for t, m in zip(ids, mask) if m]
        agent_lps = [lp for lp, m in zip(lps, mask) if m]
        assert agent_ids and len(agent_lps) == len(agent_ids)
        stored.append((tuple(agent_ids), tuple(agent_lps)))
    # the stored agent tokens and log-probs are exactly what the server sampled
    assert sorted(stored) == served
    for a in tiny_server.answers:  # and the server conditioned on the env's prompt ids
        assert a["prompt"] == tiny_server.chat.initial_ids([{"role": "user", "content": env._format_prompt(None, 0)}])


def test_multi_turn_falls_back_to_text_when_the_server_context_differs(tiny_server, tokenizer):
    env = MastermindEnv(tokenizer, {"max_turns": 3})
    agent = OpenAIChatAgent(base_url=tiny_server.url, model="tiny", max_tokens=10, tokenizer=tokenizer)
    out = env.run_trial([{"code": [1, 2, 3, 4]}], agent, num_rollouts=2)
    s = agent.stats
    assert all(st in ("done", "truncated") for st in out["statuses"])
    assert s["token_exact"] >= 2  # every first turn is exact
    assert s["token_exact"] + s["text_fallbacks"] == s["requests"] and s["token_mismatches"] == s["text_fallbacks"]


def test_mismatched_prompt_ids_policy(tiny, tokenizer):
    with TinyModelServer(*tiny, bad_prompt_ids=True) as server:
        env = MastermindEnv(tokenizer, {"max_turns": 1})
        text_agent = OpenAIChatAgent(base_url=server.url, model="tiny", max_tokens=6, tokenizer=tokenizer)
        out = env.run_trial([{"code": [1, 2, 3, 4]}], text_agent, num_rollouts=2)
        assert out["padded_logprobs"] == [None, None] and text_agent.stats["text_fallbacks"] == 2
        strict = OpenAIChatAgent(
            base_url=server.url, model="tiny", max_tokens=6, tokenizer=tokenizer, on_token_mismatch="error"
        )
        out = env.run_trial([{"code": [1, 2, 3, 4]}], strict, num_rollouts=1)
        assert (
            out["statuses"] == ["error"] and "token contract" in out["errors"][0] and "position 0" in out["errors"][0]
        )
        assert strict.stats["failures"] == 1


def test_pipeline_with_the_served_model(tiny_server, tokenizer, tmp_path):
    from hf_rollouts.pipeline import generate_rollouts

    tasks = MastermindEnv(tokenizer, {"max_turns": 1}).get_train_dataset(2)
    agent = OpenAIChatAgent(base_url=tiny_server.url, model="tiny", max_tokens=8, tokenizer=tokenizer)
    ds = generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path, progress=False)
    assert len(ds) == 2 and all(s != "error" for row in ds["statuses"] for s in row)
    again = generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path / "fresh", progress=False)
    assert again["padded_full_token_ids"] == ds["padded_full_token_ids"]  # same per-request seeds, same samples


# -- transformers serve -------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_server(tmp_path_factory):
    if not all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn", "openai")):
        pytest.skip('transformers serve needs `pip install "transformers[serving]"`')
    from hf_rollouts.tiny_model import build_tiny_model, tiny_model_path

    build_tiny_model(seed=0)
    path = str(tiny_model_path(0))
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [
        sys.executable,
        "-c",
        "from transformers.cli.transformers import main; main()",
        "serve",
        path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--default-seed",
        "0",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            try:
                with no_proxy.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve not ready in 90s:\n{log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1", path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_transformers_serve_text_only_rollouts(transformers_server, tokenizer):
    url, model = transformers_server
    env = MastermindEnv(tokenizer, {"max_turns": 2})
    agent = OpenAIChatAgent(
        base_url=url, model=model, max_tokens=6, tokenizer=tokenizer, request_token_ids=False, concurrency=4
    )
    out = env.run_trial([{"code": [1, 2, 3, 4]}, {"code": [2, 2, 2, 2]}], agent, num_rollouts=2)
    assert all(s in ("done", "truncated") for s in out["statuses"]), out["errors"]
    assert out["padded_logprobs"] == [None] * 4  # no ids from this server: text, tokenized once by the env
    assert agent.stats["requests"] == agent.stats["text_fallbacks"] > 0 and agent.stats["failures"] == 0
    assert all(sum(m) > 0 for m in out["padded_agent_token_mask"])


def test_transformers_serve_rejects_return_token_ids_with_a_clear_hint(transformers_server):
    url, model = transformers_server
    agent = OpenAIChatAgent(base_url=url, model=model, max_tokens=4, **FAST)
    with pytest.raises(OpenAIRequestError, match="request_token_ids=False") as info:
        agent.act(request())
    assert "422" in str(info.value) and agent.stats["attempts"] == 1  # a client error is not retried


# -- failure modes ---------------------------------------------------------------------------------
def test_500_then_200_is_retried():
    def respond(h, i, body):
        send_json(h, {"error": "overloaded"}, status=500) if i == 0 else send_json(h, OK_BODY)

    with LoopbackServer(respond) as server:
        agent = agent_for(server)
        action, _ = agent.act(request())
        assert action.text == "1 2 3 4" and action.token_ids is None
        assert agent.stats["retries"] == 1 and len(server.bodies) == 2


def test_429_is_retried_with_retry_after():
    def respond(h, i, body):
        send_json(h, {"error": "slow down"}, status=429, headers={"Retry-After": "0"}) if i < 2 else send_json(
            h, OK_BODY
        )

    with LoopbackServer(respond) as server:
        agent = agent_for(server)
        assert agent.act(request())[0].text == "1 2 3 4" and agent.stats["retries"] == 2


def test_slow_server_times_out_then_succeeds():
    def respond(h, i, body):
        if i == 0:
            time.sleep(1.0)  # longer than the client's timeout
        send_json(h, OK_BODY)

    with LoopbackServer(respond) as server:
        agent = agent_for(server, timeout=0.3)
        t0 = time.monotonic()
        assert agent.act(request())[0].text == "1 2 3 4"
        assert agent.stats["retries"] == 1 and time.monotonic() - t0 < 5


def test_always_slow_server_gives_a_clear_error():
    with LoopbackServer(lambda h, i, body: (time.sleep(0.6), send_json(h, OK_BODY))) as server:
        agent = agent_for(server, timeout=0.2, max_retries=1)
        with pytest.raises(OpenAIRequestError, match=r"failed after 2 attempt\(s\).*timed out"):
            agent.act(request())


def test_dropped_connection_is_retried():
    def respond(h, i, body):
        drop_mid_response(h) if i < 2 else send_json(h, OK_BODY)

    with LoopbackServer(respond) as server:
        agent = agent_for(server)
        assert agent.act(request())[0].text == "1 2 3 4" and agent.stats["retries"] == 2


def test_always_dropped_connection_and_nothing_listening():
    with LoopbackServer(lambda h, i, body: drop_mid_response(h)) as server:
        with pytest.raises(OpenAIRequestError, match=r"failed after 3 attempt\(s\).*IncompleteRead"):
            agent_for(server, max_retries=2).act(request())
    port = _free_port()
    agent = OpenAIChatAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, **FAST)
    with pytest.raises(
        OpenAIRequestError, match=r"failed after 2 attempt\(s\).*(Connection refused|ConnectionRefused)"
    ):
        agent.act(request())


def test_client_errors_are_not_retried():
    with LoopbackServer(lambda h, i, body: send_json(h, {"error": "bad model"}, status=404)) as server:
        agent = agent_for(server)
        with pytest.raises(OpenAIRequestError, match="HTTP 404.*not retried.*bad model.*Check base_url"):
            agent.act(request())
        assert len(server.bodies) == 1 and agent.stats["retries"] == 0


def test_always_500_episodes_are_recorded_as_errors(tokenizer):
    with LoopbackServer(lambda h, i, body: send_json(h, {"error": "boom"}, status=500)) as server:
        env = MastermindEnv(tokenizer, {"max_turns": 3})
        agent = agent_for(server, max_retries=2)
        out = env.run_trial([{"code": [1, 2, 3, 4]}, {"code": [4, 3, 2, 1]}], agent, num_rollouts=2)
        assert out["statuses"] == ["error"] * 4
        assert all(math.isnan(r) for r in out["final_rewards"])  # never scored
        assert all("HTTP 500" in e and "after 3 attempt(s)" in e and "boom" in e for e in out["errors"])
        assert len(server.bodies) == 4 * 3 and agent.stats["failures"] == 4


def test_malformed_json_is_retried_then_reported():
    def respond(h, i, body):
        data = b"not json"
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    with LoopbackServer(respond) as server:
        with pytest.raises(OpenAIRequestError, match="not valid JSON"):
            agent_for(server, max_retries=1).act(request())


# -- concurrency, seeds, parsing, settings --------------------------------------------------------
def test_batch_is_sent_concurrently_up_to_the_limit():
    def respond(h, i, body):
        time.sleep(0.15)
        send_json(h, {"choices": [{"message": {"content": body["messages"][0]["content"]}, "finish_reason": "stop"}]})

    with LoopbackServer(respond) as server:
        agent = agent_for(server, concurrency=3)
        t0 = time.monotonic()
        out = agent.act_batch([request(f"q{i}", f"s{i}") for i in range(9)])
        elapsed = time.monotonic() - t0
        assert [a.text for a, _ in out] == [f"q{i}" for i in range(9)]  # answers in request order
        assert server.max_in_flight == 3 and elapsed < 9 * 0.15
        agent.close()


def test_vllm_token_id_strings_and_length_finish():
    payload = {
        "choices": [
            {
                "message": {"content": "ab"},
                "finish_reason": "length",
                "logprobs": {
                    "content": [{"token": "token_id:17", "logprob": -0.5}, {"token": "token_id:4", "logprob": -1.5}]
                },
            }
        ]
    }
    with LoopbackServer(lambda h, i, body: send_json(h, payload)) as server:
        action, _ = agent_for(server).act(request())
        assert action.token_ids == [17, 4] and action.logprobs == [-0.5, -1.5] and action.stopped is False


def test_request_seeds_settings_and_fingerprint(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    agent = OpenAIChatAgent(
        base_url="http://127.0.0.1:9/v1", model="m", temperature=0.7, seed=5, extra_body={"top_k": 20}
    )
    a, b = agent.request_body(request(session="row0/rollout0")), agent.request_body(request(session="row0/rollout1"))
    assert a["seed"] != b["seed"] and a["seed"] == agent.request_body(request(session="row0/rollout0"))["seed"]
    agent.set_seed(1)
    assert agent.request_body(request(session="row0/rollout0"))["seed"] != a["seed"]
    assert a["top_k"] == 20 and a["temperature"] == 0.7 and a["logprobs"] is True and a["return_token_ids"] is True
    assert "seed" not in OpenAIChatAgent(base_url="http://x/v1", model="m", seed=None).request_body(request())
    fp, desc = agent.fingerprint(), agent.describe()
    assert fp["base_url"] == "http://127.0.0.1:9/v1" and fp["model"] == "m" and fp["sampling"]["temperature"] == 0.7
    assert desc["model"] == "m" and desc["sampling"]["seed"] == 5
    assert "sk-secret" not in json.dumps(fp) + json.dumps(desc)
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert parse_openai_spec("openai:http://127.0.0.1:8000/v1#org/model") == ("http://127.0.0.1:8000/v1", "org/model")
    assert OpenAIChatAgent.from_spec("openai:http://h/v1#m", max_tokens=3).settings.max_tokens == 3
    for bad in ("http://h#m", "openai:http://h/v1", "openai:#m"):
        with pytest.raises(ValueError):
            parse_openai_spec(bad)
    with pytest.raises(ValueError):
        OpenAISettings(model="")
    with pytest.raises(ValueError):
        OpenAISettings(model="m", on_token_mismatch="maybe")


def test_api_key_is_sent_and_agent_pickles(monkeypatch):
    import pickle

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    seen = []

    class Capture(LoopbackServer):
        pass

    def respond(h, i, body):
        seen.append(h.headers.get("Authorization"))
        send_json(h, OK_BODY)

    with Capture(respond) as server:
        agent = agent_for(server)
        agent.act(request())
        clone = pickle.loads(pickle.dumps(agent))
        assert clone.act(request())[0].text == "1 2 3 4"
    assert seen == ["Bearer sk-test", "Bearer sk-test"]


def test_later_turns_without_prompt_ids_are_not_trusted_as_exact(tiny, tokenizer):
    with TinyModelServer(*tiny, omit_prompt_ids=True) as server:
        env = MastermindEnv(tokenizer, {"max_turns": 2})
        agent = OpenAIChatAgent(base_url=server.url, model="tiny", max_tokens=6, tokenizer=tokenizer)
        out = env.run_trial([{"code": [6, 6, 6, 6]}], agent, num_rollouts=1)
        assert out["num_turns"] == [2]
        mask, sampled = out["padded_agent_token_mask"][0], out["padded_sampled_token_mask"][0]
        turns = [i for i, m in enumerate(mask) if m]
        first_turn_end = next(i for i in range(turns[0], len(mask)) if not mask[i])
        assert all(sampled[i] for i in range(turns[0], first_turn_end))  # turn 1: the server saw what we stored
        assert not any(sampled[i] for i in turns if i >= first_turn_end)  # turn 2: unverifiable context -> text
        assert agent.stats["token_mismatches"] == 1
