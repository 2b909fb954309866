"""``--backend vllm-server`` without vLLM (hf_rollouts/recipes/served.py): the weight sync's HTTP calls against a
loopback stand-in for the server (the network boundary: it records what a vLLM server would be asked and reads the
weights file while the call is open), its errors, and a server Python without vLLM failing with how to fix it. The
real server is run by tests/test_vllm_training.py in the vLLM venv."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hf_rollouts.agents.hf.agent import weights_probe
from hf_rollouts.agents.loading import load_agent
from hf_rollouts.recipes.served import ServedPolicy, ServerError, serve_policy
from hf_rollouts.recipes.train_config import TrainConfig


@pytest.fixture
def stand_in():
    """A loopback server recording each POST ``(path, body, tensors in the weights file at that moment)``; a path in
    ``fail`` answers 500."""
    calls, fail = [], set()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            path = body.get("kwargs", {}).get("weights_path")
            found = sorted(load_file(str(Path(path) / "model.safetensors"))) if path else None
            calls.append((self.path, body, found))
            self.send_response(500 if self.path in fail else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", calls, fail
    server.shutdown()


def test_sync_weights_asks_the_server_to_reload_a_file_of_every_weight_then_drops_its_prefix_cache(stand_in):
    root, calls, fail = stand_in
    policy = load_agent("tiny")
    agent = ServedPolicy(base_url=root + "/v1", model="policy", mode="tokens", tokenizer=policy.tokenizer, root=root,
                         process=None, log=None)  # fmt: skip
    times = agent.sync_weights(policy.model)
    (rpc, rpc_body, tensors), (reset, _, _) = calls
    assert (rpc, reset) == ("/collective_rpc", "/reset_prefix_cache")
    assert rpc_body["method"] == "reload_weights" and set(rpc_body["kwargs"]) == {"weights_path"}
    assert "lm_head.weight" in tensors and set(policy.model.state_dict()) <= set(tensors)  # tied head included
    assert not Path(rpc_body["kwargs"]["weights_path"]).exists()  # removed once the server has them
    assert agent._weights_probe == weights_probe(policy.model) and set(times) == {"write_s", "load_s"}
    fail.add("/collective_rpc")
    with pytest.raises(ServerError, match="POST .*/collective_rpc failed"):
        agent.sync_weights(policy.model)


def test_trls_async_weight_transfer_reloads_the_same_file_through_the_same_call(stand_in, tmp_path):
    """``ServerWeightReload`` (TRL's async trainer against ``vllm serve``) shares the sync's reload
    (:func:`~hf_rollouts.agents.vllm.weights.reload_on_server`): every weight, the tied head included, under the
    ``scratch`` it names, removed afterwards; pause and resume around it; an error status raised with the hint."""
    from hf_rollouts.integrations.trl.async_weights import ServerWeightReload

    root, calls, fail = stand_in
    policy = load_agent("tiny")
    transfer = ServerWeightReload(root, scratch=str(tmp_path))
    transfer.bind(policy.model)
    transfer.pause()
    transfer.send_weights(iter(()))
    transfer.resume()
    (pause, _, _), (rpc, rpc_body, tensors), (resume, _, _) = calls
    assert (pause, rpc, resume) == ("/pause?mode=wait", "/collective_rpc", "/resume")
    assert rpc_body["method"] == "reload_weights" and set(policy.model.state_dict()) <= set(tensors)
    where = Path(rpc_body["kwargs"]["weights_path"])
    assert where.parent == tmp_path and not where.exists()
    fail.add("/collective_rpc")
    with pytest.raises(RuntimeError, match="answered 500"):
        transfer.send_weights(iter(()))


def test_a_server_python_without_vllm_fails_saying_how_to_fix_it(tmp_path):
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed in this Python")
    policy = load_agent("tiny")
    cfg = TrainConfig(server_python=sys.executable, max_new_tokens=3)
    with pytest.raises(ServerError, match="Is vLLM installed in --server-python"):
        serve_policy(policy.model, policy.tokenizer, cfg, tmp_path)
    assert "No module named 'vllm'" in (tmp_path / "vllm-server.log").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_the_server_ends_when_the_run_is_killed(tmp_path):
    """The server is started with end_with_parent: a run SIGKILLed (no close, no cleanup) leaves no server behind.
    Here the "server" is a sleep started the same way by a parent that is then SIGKILLed."""
    import os
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from hf_rollouts.recipes.served import end_with_parent\n"
        "p = subprocess.Popen(['sleep', '600'], start_new_session=True, preexec_fn=end_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n")])  # fmt: skip
    deadline = time.monotonic() + 300  # the parent imports hf_rollouts first (slow on a loaded machine)
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    for _ in range(1200):  # the kernel sends SIGTERM to the child when its parent dies
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":
            break  # ended, not yet reaped (its parent is init now)
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its killed parent")
