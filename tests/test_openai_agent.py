"""OpenAIChatAgent's client, parsing and negotiation against scripted HTTP servers on 127.0.0.1.

Scripted servers (stdlib ``http.server``) answer what a test needs: slow answers, 5xx, 429,
4xx, a connection dropped mid-response, a trickled body, redirects, malformed 200s, and the
answers that drive capability negotiation. Real servers (the tiny model behind a vLLM-protocol
server, ``transformers serve``) are in ``test_servers.py``.

Every server listens on 127.0.0.1 only, every loop and wait is bounded.
"""

from __future__ import annotations

import json
import math
import pickle
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hf_rollouts.agents.openai import (
    OpenAIChatAgent,
    OpenAIRequestError,
    OpenAISettings,
    chat_completions_url,
    completions_url,
    parse_openai_spec,
)
from hf_rollouts.agents.sampling import SamplingConfig
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.types import AgentRequest

FAST = {"backoff": 0.01, "max_backoff": 0.05}
CHAT_ONLY = {"mode": "chat", "request_token_ids": False, "request_logprobs": False}  # explicit: no probe
OK_BODY = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "1 2 3 4"}, "finish_reason": "stop"}]}


# -- loopback servers ------------------------------------------------------------------
class LoopbackServer:
    """A ThreadingHTTPServer on 127.0.0.1:<free port>, serving ``respond(handler, index, body)`` in a thread."""

    def __init__(self, respond):
        self.respond = respond
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.client_ports: list[int] = []
        self.headers: list[dict] = []
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
                    server.paths.append(self.path)
                    server.client_ports.append(self.client_address[1])
                    server.headers.append(dict(self.headers))
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
    return OpenAIChatAgent(base_url=server.url, model="test-model", **{**FAST, **CHAT_ONLY, **kw})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(text="Guess the code.", session="s"):
    return AgentRequest(messages=[{"role": "user", "content": text}], prompt_token_ids=[], session_id=session)


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
        with pytest.raises(OpenAIRequestError, match=r"failed after 3 attempt\(s\).*RemoteProtocolError"):
            agent_for(server, max_retries=2).act(request())
    port = _free_port()
    agent = OpenAIChatAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1, **FAST, **CHAT_ONLY)
    with pytest.raises(OpenAIRequestError, match=r"failed after 2 attempt\(s\).*ConnectError"):
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
        base_url="http://127.0.0.1:9/v1", model="m", temperature=0.7, seed=5, extra_body={"top_k": 20}, **CHAT_ONLY
    )
    assert agent.sampling == SamplingConfig(temperature=0.7)  # sampling keywords go to the one SamplingConfig
    a, b = agent.request_body(request(session="row0/rollout0")), agent.request_body(request(session="row0/rollout1"))
    assert a["seed"] != b["seed"] and a["seed"] == agent.request_body(request(session="row0/rollout0"))["seed"]
    agent.set_seed(1)
    assert agent.request_body(request(session="row0/rollout0"))["seed"] != a["seed"]
    assert a["top_k"] == 20 and a["temperature"] == 0.7 and a["max_tokens"] == agent.sampling.max_new_tokens
    fp, desc = agent.fingerprint(), agent.describe()  # explicit chat settings: no probe, no network
    assert fp["negotiated"]["mode"] == "chat" and fp["negotiated"]["source"] == "settings"
    assert set(fp["negotiated"]["dropped"]) == {"return_token_ids", "logprobs"}
    assert "logprobs" not in agent.request_body(request()) and "return_token_ids" not in agent.request_body(request())
    assert fp["base_url"] == "http://127.0.0.1:9/v1" and fp["model"] == "m" and fp["sampling"]["temperature"] == 0.7
    assert desc["model"] == "m" and desc["sampling"]["seed"] == 5 and desc["mode"] == "chat"
    assert "sk-secret" not in json.dumps(fp) + json.dumps(desc)
    no_seed = OpenAIChatAgent(base_url="http://x/v1", model="m", seed=None, **CHAT_ONLY)
    assert "seed" not in no_seed.request_body(request())
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert completions_url("http://h:1/v1/chat/completions") == "http://h:1/v1/completions"
    assert parse_openai_spec("openai:http://127.0.0.1:8000/v1#org/model") == ("http://127.0.0.1:8000/v1", "org/model")
    spec_agent = OpenAIChatAgent.from_spec("openai:http://h/v1#m", max_new_tokens=3)
    assert spec_agent.sampling.max_new_tokens == 3 and spec_agent.describe()["mode"] == "auto (not negotiated yet)"
    for bad in ("http://h#m", "openai:http://h/v1", "openai:#m"):
        with pytest.raises(ValueError):
            parse_openai_spec(bad)
    for bad_settings in ({"model": ""}, {"model": "m", "on_token_mismatch": "maybe"}, {"model": "m", "mode": "x"}):
        with pytest.raises(ValueError):
            OpenAISettings(**bad_settings)
    with pytest.raises(ValueError, match="temperature"):
        OpenAIChatAgent(base_url="http://h/v1", model="m", temperature=-1)  # validated once, by SamplingConfig
    with pytest.raises(TypeError, match="SamplingConfig"):
        OpenAIChatAgent(base_url="http://h/v1", model="m", sampling=SamplingConfig(), temperature=0.5)
    assert not hasattr(OpenAISettings(model="m"), "temperature")  # sampling is never restated in the settings


def test_api_key_is_sent_and_agent_pickles(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")

    def respond(h, i, body):
        send_json(h, OK_BODY)

    with LoopbackServer(respond) as server:
        agent = agent_for(server)
        agent.act(request())
        clone = pickle.loads(pickle.dumps(agent))
        assert clone.act(request())[0].text == "1 2 3 4"
    assert [h.get("Authorization") for h in server.headers] == ["Bearer sk-test", "Bearer sk-test"]


# -- hardening ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "choice, message",
    [
        ({"finish_reason": "stop"}, "no message"),
        ({"message": {"role": "assistant", "content": None}, "finish_reason": "stop"}, "NoneType, not text"),
        ({"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}, "empty content and no token"),
    ],
)
def test_a_200_without_usable_content_is_an_episode_error(tokenizer, choice, message):
    with LoopbackServer(lambda h, i, body: send_json(h, {"choices": [choice]})) as server:
        env = MastermindEnv(tokenizer, {"max_turns": 2})
        agent = agent_for(server)
        out = env.run_trial([{"code": [1, 2, 3, 4]}], agent, num_rollouts=2)
    assert out["statuses"] == ["error", "error"] and all(message in e for e in out["errors"])
    assert all(math.isnan(r) for r in out["final_rewards"]) and out["num_turns"] == [0, 0]
    assert agent.stats["failures"] == 2 and agent.stats["retries"] == 0


def test_no_choices_is_an_error():
    with LoopbackServer(lambda h, i, body: send_json(h, {"object": "chat.completion", "choices": []})) as server:
        with pytest.raises(OpenAIRequestError, match=r"no choices\[0\]"):
            agent_for(server).act(request())


def test_redirects_are_not_followed_and_the_key_stays_home(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with LoopbackServer(lambda h, i, body: send_json(h, OK_BODY)) as elsewhere:

        def redirect(h, i, body):
            h.send_response(307)
            h.send_header("Location", elsewhere.url + "/chat/completions")
            h.send_header("Content-Length", "0")
            h.end_headers()

        with LoopbackServer(redirect) as server:
            agent = agent_for(server)
            with pytest.raises(OpenAIRequestError, match="HTTP 307, a redirect to .* not followed"):
                agent.act(request())
    assert elsewhere.bodies == [] and agent.stats["attempts"] == 1  # never followed, never retried


def test_a_trickling_server_hits_the_total_deadline():
    def trickle(h, i, body):
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "100000")
        h.end_headers()
        try:
            for _ in range(400):  # one byte every 20 ms: no single read ever times out
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.02)
        except OSError:
            pass  # the client hung up at its deadline

    with LoopbackServer(trickle) as server:
        agent = agent_for(server, timeout=0.5, max_retries=0)
        with pytest.raises(OpenAIRequestError, match=r"did not complete within the 0.5s deadline"):
            agent.act(request())


def test_connections_are_pooled():
    with LoopbackServer(lambda h, i, body: send_json(h, OK_BODY)) as server:
        agent = agent_for(server, concurrency=2)
        for i in range(6):
            agent.act(request(session=f"s{i}"))
        assert len(server.client_ports) == 6 and len(set(server.client_ports)) == 1  # one kept-alive connection
        agent.close()


# -- negotiation against scripted servers ---------------------------------------------------------
def _completion(ids, logprobs=None, prompt_ids=None, text="x"):
    choice = {"index": 0, "text": text, "finish_reason": "stop", "token_ids": ids, "prompt_token_ids": prompt_ids}
    if logprobs is not None:
        choice["logprobs"] = {"token_logprobs": logprobs, "tokens": [], "text_offset": [], "top_logprobs": []}
    return {"object": "text_completion", "choices": [choice]}


def test_a_422_naming_a_field_drops_it_and_is_not_a_failure(tokenizer):
    def respond(h, i, body):
        if "stop_token_ids" in body:  # transformers-serve style rejection of one field
            send_json(h, {"detail": "Unexpected fields in the request: {'stop_token_ids'}"}, status=422)
        else:
            ids = [7, 8, tokenizer.eos_token_id]
            send_json(h, _completion(ids, [-0.5, -0.25, -1.0], body["prompt"], "ab"))

    with LoopbackServer(respond) as server:
        agent = OpenAIChatAgent(base_url=server.url, model="m", tokenizer=tokenizer, **FAST)
        ids = tokenizer("hello", add_special_tokens=False)["input_ids"]
        action, _ = agent.act(AgentRequest(messages=[{"role": "user", "content": "hello"}], prompt_token_ids=ids))
    caps = agent.capabilities
    assert caps.mode == "tokens" and caps.dropped == ("stop_token_ids",) and caps.returns_logprobs
    assert action.token_ids == [7, 8, tokenizer.eos_token_id] and action.logprobs == [-0.5, -0.25, -1.0]
    assert server.paths == ["/v1/completions"] * 3 and "stop_token_ids" not in server.bodies[2]
    assert server.bodies[2]["prompt"] == ids and server.bodies[2]["logprobs"] == 0
    s = agent.stats
    assert (s["probe_requests"], s["failures"], s["retries"], s["token_exact"], s["prompts_verified"]) == (
        2,
        0,
        0,
        1,
        1,
    )


def test_a_200_without_ids_negotiates_chat_mode(tokenizer):
    def respond(h, i, body):
        if h.path.endswith("/v1/completions"):
            send_json(h, {"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]})  # field ignored
        else:
            send_json(h, OK_BODY)

    with LoopbackServer(respond) as server:
        agent = OpenAIChatAgent(base_url=server.url, model="m", tokenizer=tokenizer, **FAST)
        action, _ = agent.act(request())
    assert agent.capabilities.mode == "chat" and not agent.capabilities.returns_ids
    assert "without choices[0].token_ids" in agent.capabilities.notes[0]
    assert action.text == "1 2 3 4" and action.token_ids is None
    assert server.paths == ["/v1/completions", "/v1/chat/completions", "/v1/chat/completions"]
    assert agent.stats["text_fallbacks"] == 1 and agent.describe()["negotiated"]["mode"] == "chat"


def test_explicit_settings_override_the_probe(tokenizer):
    with LoopbackServer(lambda h, i, body: send_json(h, {"choices": [{"text": "no ids"}]})) as server:
        agent = OpenAIChatAgent(base_url=server.url, model="m", tokenizer=tokenizer, mode="tokens", **FAST)
        with pytest.raises(OpenAIRequestError, match=r"token_ids is 'None'"):  # token mode: never a text fallback
            agent.act(AgentRequest(messages=[], prompt_token_ids=[3, 4]))
    assert server.paths == ["/v1/completions"] and agent.capabilities.source == "settings"
    assert agent.stats["text_fallbacks"] == 0 and agent.stats["failures"] == 1


@pytest.mark.parametrize(
    "answer, message",
    [
        (lambda prompt: _completion([5, 6], [-1.0, -2.0], [0, *prompt]), "first difference at position 0"),
        (lambda prompt: _completion([5, 6], [-1.0], prompt), "1 log-probs for 2 token ids"),
        (lambda prompt: _completion([5, 10**6], [-1.0, -2.0], prompt), "outside the env tokenizer's vocabulary"),
        (lambda prompt: _completion([5, 6], None, prompt), "token_logprobs is missing"),
    ],
)
def test_token_mode_contract_violations_are_errors(tokenizer, answer, message):
    with LoopbackServer(lambda h, i, body: send_json(h, answer(body["prompt"]))) as server:
        agent = OpenAIChatAgent(base_url=server.url, model="m", tokenizer=tokenizer, mode="tokens", **FAST)
        with pytest.raises(OpenAIRequestError, match=message):
            agent.act(AgentRequest(messages=[], prompt_token_ids=[3, 4, 5]))
    assert agent.stats["token_exact"] == 0 and agent.stats["text_fallbacks"] == 0


def test_a_failed_probe_fails_every_request_of_the_batch():
    port = _free_port()
    agent = OpenAIChatAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0, **FAST)
    out = agent.act_batch([request(session="a"), request(session="b")])
    assert all(isinstance(r, OpenAIRequestError) and "ConnectError" in str(r) for r in out)


def test_a_failed_probe_is_remembered_and_fails_fast():
    port = _free_port()  # nothing listens: the probe fails after its retries
    agent = OpenAIChatAgent(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2, **FAST)
    first = agent.act_batch([request(session="a")])
    attempts = agent.stats["attempts"]
    assert attempts == 3 and "ConnectError" in str(first[0])
    t0 = time.monotonic()
    later = agent.act_batch([request(session=f"b{i}") for i in range(3)]) + [agent.submit(request()).exception()]
    assert agent.stats["attempts"] == attempts and time.monotonic() - t0 < 1  # no new probe, no backoff
    assert all(isinstance(e, OpenAIRequestError) and "probe failed earlier" in str(e) for e in later)
    assert all("ConnectError" in str(e) for e in later)  # the first failure's cause, said again
    with pytest.raises(OpenAIRequestError, match="probe failed earlier"):
        agent.fingerprint()
    agent.close()  # forgets the failure: the next request probes again
    agent.act_batch([request()])
    assert agent.stats["attempts"] == 2 * attempts


def test_a_server_that_trickles_its_headers_hits_the_total_deadline():
    def trickle_headers(h, i, body):
        try:
            h.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            for _ in range(500):  # one header byte every 20 ms for 10 s: no single read ever times out
                h.wfile.write(b"a")
                h.wfile.flush()
                time.sleep(0.02)
        except OSError:
            pass  # the client hung up at its deadline
        h.close_connection = True

    with LoopbackServer(trickle_headers) as server:
        agent = agent_for(server, timeout=0.5, max_retries=0)
        t0 = time.monotonic()
        with pytest.raises(OpenAIRequestError, match=r"did not complete within the 0.5s deadline"):
            agent.act(request())
        assert time.monotonic() - t0 < 2.5  # the deadline covers the status line and headers, not only the body


def test_a_server_that_stalls_mid_body_is_cut_at_the_deadline():
    def stall(h, i, body):
        h.send_response(200)
        h.send_header("Content-Length", "1000")
        h.end_headers()
        try:
            for _ in range(3):
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.1)
            time.sleep(3.0)  # silent: only the watchdog ends the read before the per-read timeout would
        except OSError:
            pass

    with LoopbackServer(stall) as server:
        agent = agent_for(server, timeout=0.6, max_retries=0)
        with pytest.raises(OpenAIRequestError, match=r"did not complete within the 0.6s deadline"):
            agent.act(request())


def test_every_connection_of_the_client_is_bounded_by_the_attempt_deadline():
    """The deadline bounds the whole attempt whatever carries it: with a connector whose name lookup never answers
    (aiohttp's own timeouts left at theirs), a request still ends at its deadline and never reaches the server."""
    import asyncio

    import aiohttp
    from aiohttp.abc import AbstractResolver

    from hf_rollouts.aio import ENGINE_LOOP

    class Silent(AbstractResolver):
        async def resolve(self, host, port=0, family=socket.AF_INET):
            await asyncio.sleep(3600)

        async def close(self):
            pass

    async def silent_session():
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=Silent()))

    with LoopbackServer(lambda h, i, body: send_json(h, OK_BODY)) as server:
        url = server.url.replace("127.0.0.1", "localhost")  # a name, so the connector must look it up
        agent = OpenAIChatAgent(base_url=url, model="m", timeout=0.4, max_retries=0, **FAST, **CHAT_ONLY)
        agent._http()._session = ENGINE_LOOP.call(silent_session())
        t0 = time.monotonic()
        with pytest.raises(OpenAIRequestError, match=r"did not complete within the 0.4s deadline"):
            agent.act(request())
        assert time.monotonic() - t0 < 2.5 and server.bodies == []  # never reached the server
        agent.close()


def test_many_requests_in_flight_reuse_their_connections_against_a_server_in_its_own_process(tmp_path):
    """Two waves of 300 requests, 64 in flight, against the benchmark's loopback server in a process of its own
    (``scripts/benchmark_client.py --serve``): every answer arrives, nothing is retried, and the client opened at
    most 64 connections over both waves (keep-alive: the second wave opens none)."""
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_client.py"
    (tmp_path / "guesses.json").write_text("{}")  # chat answers need no token table
    cmd = [sys.executable, str(script), "--serve", "--guesses", str(tmp_path / "guesses.json"), "--server-lifetime",
           "120"]  # fmt: skip
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().split()[1]
        agent = OpenAIChatAgent(base_url=f"http://127.0.0.1:{port}/instant/v1", model="m", concurrency=64,
                                timeout=30, max_retries=0, **CHAT_ONLY)  # fmt: skip
        for wave in range(2):
            out = agent.act_batch([request(session=f"{wave}/{i}") for i in range(300)])
            assert [a for a in out if isinstance(a, Exception)] == []
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as answer:
            stats = json.loads(answer.read())
        assert stats["server_requests"] == 600 and 1 <= stats["connections"] <= 64
        assert agent.stats["attempts"] == 600 and agent.stats["retries"] == 0
        agent.close()
    finally:
        server.stdin.close()  # the server exits when its stdin closes
        server.wait(timeout=30)


def test_a_client_dropped_without_close_has_its_session_closed():
    import gc

    with LoopbackServer(lambda h, i, body: send_json(h, OK_BODY)) as server:
        agent = agent_for(server)
        agent.act(request())
        session = agent._http()._session
        del agent
        gc.collect()
        deadline = time.monotonic() + 5
        while not session.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert session.closed  # closed on the engine loop, so aiohttp has no unclosed session to report


# -- sampling fields, log-prob conventions, stop ids -------------------------------------------------
NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def test_every_sampling_field_is_sent_in_both_modes(tokenizer):
    tokens = OpenAIChatAgent(base_url="http://h/v1", model="m", tokenizer=tokenizer, mode="tokens", top_p=0.9)
    tokens.negotiate()  # settings decide: no network
    chat = OpenAIChatAgent(base_url="http://h/v1", model="m", top_p=0.9, **CHAT_ONLY)
    chat.negotiate()
    prompt = AgentRequest(messages=[{"role": "user", "content": "hi"}], prompt_token_ids=[3, 4])
    for body in (tokens.request_body(prompt), chat.request_body(prompt)):
        assert {k: body[k] for k in NEUTRAL} == NEUTRAL  # never left to the model's generation_config
        assert (body["temperature"], body["top_p"]) == (1.0, 0.9)
    overridden = OpenAIChatAgent(base_url="http://h/v1", model="m", extra_body={"top_k": 20}, **CHAT_ONLY)
    assert overridden.request_body(prompt)["top_k"] == 20  # extra_body still wins
    top_k = OpenAIChatAgent(base_url="http://h/v1", model="m", top_k=7, **CHAT_ONLY)
    assert top_k.request_body(prompt)["top_k"] == 7  # SamplingConfig's top-k replaces the neutral -1


def test_a_server_rejecting_neutral_fields_by_name_drops_them_for_good():
    def respond(h, i, body):
        rejected = sorted(k for k in ("top_k", "min_p", "repetition_penalty") if k in body)
        if rejected:  # OpenAI's answer to fields it does not know
            message = f"Unrecognized request arguments supplied: {', '.join(rejected)}"
            send_json(h, {"error": {"message": message, "type": "invalid_request_error"}}, status=400)
        else:
            send_json(h, OK_BODY)

    with LoopbackServer(respond) as server:
        agent = agent_for(server)  # explicit chat settings: no probe, so the first request negotiates
        assert agent.act(request())[0].text == "1 2 3 4" and agent.act(request())[0].text == "1 2 3 4"
    assert len(server.bodies) == 3  # one rejected, then each request once without the fields
    assert "top_k" in server.bodies[0] and not any("top_k" in b or "min_p" in b for b in server.bodies[1:])
    assert server.bodies[1]["presence_penalty"] == 0.0  # fields the server accepts are still sent
    assert {"top_k", "min_p", "repetition_penalty"} <= set(agent.capabilities.dropped)
    assert agent.stats["failures"] == 0 and agent.stats["requests"] == 2


@pytest.mark.parametrize(
    "sampling, extra, named",
    [
        ({"temperature": 0.8, "top_p": 0.9}, {}, "top_p=0.9"),
        ({"temperature": 0.8, "top_k": 5}, {}, "top_k=5"),
        ({"temperature": 0.8}, {"top_k": 20}, "extra_body top_k=20"),
        ({"temperature": 0.8}, {"min_p": 0.05}, "extra_body min_p=0.05"),
        ({"temperature": 0.8}, {"repetition_penalty": 1.05}, "extra_body repetition_penalty=1.05"),
    ],
)
def test_processed_logprobs_with_truncated_sampling_are_refused(sampling, extra, named):
    with pytest.raises(ValueError, match=rf"logprobs_mode='processed' with {named}.*Use top_p=1.*logprobs_mode='raw'"):
        OpenAIChatAgent(base_url="http://h/v1", model="m", logprobs_mode="processed", extra_body=extra, **sampling)
    OpenAIChatAgent(base_url="http://h/v1", model="m", extra_body=extra, **sampling)  # raw: before all of it
    for fine in ({"temperature": 0.8}, {"temperature": 0.0, "top_p": 0.9}):  # top_p=1; greedy ignores top-p
        OpenAIChatAgent(base_url="http://h/v1", model="m", logprobs_mode="processed", **fine)


def test_stop_ids_are_computed_once_per_agent(tokenizer, monkeypatch):
    import hf_rollouts.chat as chat

    built = []

    class CountingChatDelta(chat.ChatDelta):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(chat, "ChatDelta", CountingChatDelta)
    agent = OpenAIChatAgent(base_url="http://h/v1", model="m", tokenizer=tokenizer, mode="tokens")
    agent.negotiate()
    bodies = [agent.request_body(AgentRequest(messages=[], prompt_token_ids=[3, i])) for i in range(5)]
    assert len(built) == 1 and all(b["stop_token_ids"] == [tokenizer.eos_token_id] for b in bodies)
    assert pickle.loads(pickle.dumps(agent)).stop_token_ids() == [tokenizer.eos_token_id]


def test_agent_modules_stay_under_400_lines():
    from pathlib import Path

    import hf_rollouts.agents.openai as package

    sizes = {p.name: len(p.read_text().splitlines()) for p in Path(package.__file__).parent.glob("*.py")}
    assert max(sizes.values()) < 400, sizes
