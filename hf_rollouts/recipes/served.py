"""The policy of a training run served by a vLLM server of its own (``--backend vllm-server``).

What a user gets: the trainer in this process (any venv with torch), the sampler in a vLLM OpenAI-compatible server
in another process (``--server-python``: the Python whose vLLM serves, e.g. the vLLM venv's, which
``bash scripts/setup_vllm.sh --check`` prints; on a GPU machine, a server on another device), sampled over HTTP
by :class:`ServedPolicy` (the :class:`~hf_rollouts.agents.openai.OpenAIChatAgent` in token mode: the stored prompt
ids in, the server's sampled ids and ``processed`` log-probs stored verbatim), its weights reloaded in place after
each update without a restart.

* **The server** (:func:`serve_policy`): ``python -m vllm.entrypoints.openai.api_server`` on the run's starting
  weights (saved with the tokenizer to a temporary directory), on a free loopback port, float32, processed
  log-probs at ``--temperature``, ``--seed``, with ``VLLM_SERVER_DEV_MODE=1`` (vLLM 0.32 mounts its development
  routes, ``/collective_rpc`` and ``/reset_prefix_cache``, only then: a server for training, never one to expose).
  Its output goes to ``OUTPUT_DIR/vllm-server.log``; it ends with the run (``close``), also when the run fails or
  is killed (:func:`end_with_parent`).
* **The sync** (:meth:`ServedPolicy.sync_weights`): the model's weights as one safetensors file
  (:func:`~hf_rollouts.agents.vllm.weights.checkpoint_tensors`: tied embeddings included) in a directory the server
  can read (same machine: ``/dev/shm`` where it exists), then ``POST /collective_rpc`` ``{"method":
  "reload_weights", "kwargs": {"weights_path": DIR}}`` (every worker reloads in place, as the in-process agent's
  sync does) and ``POST /reset_prefix_cache`` (its KV came from the old weights). Between rounds, like the
  in-process agent's: a request running across the reload would mix two policies. The fingerprint then carries the
  loaded weights' probe, so a cache never serves a round of other weights.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..agents.hf.agent import weights_probe
from ..agents.openai import OpenAIChatAgent

SERVED_NAME = "policy"
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
STARTUP_S = 900.0
"""How long :func:`serve_policy` waits for the server's ``/health`` (a CPU server loads and warms up for minutes)."""


class ServerError(RuntimeError):
    """The policy's server did not start, or refused a weight reload (the message names its log)."""


class ServedPolicy(OpenAIChatAgent):
    """The OpenAI-compatible agent on a server :func:`serve_policy` started, with :meth:`sync_weights`; ``close``
    also stops the server."""

    def __init__(self, *args: Any, root: str, process: subprocess.Popen | None, log: Path | None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.root, self.process, self.log = root, process, log
        self._weights_probe: str | None = None

    def post(self, path: str, body: dict | None = None, timeout: float = 600.0) -> Any:
        """``POST root + path`` with a JSON ``body``; its JSON answer (``None``: none). :class:`ServerError` on an
        error status or no answer."""
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(self.root + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with NO_PROXY.open(req, timeout=timeout) as r:
                raw = r.read()
        except (urllib.error.URLError, OSError) as exc:
            detail = exc.read().decode(errors="replace")[:500] if isinstance(exc, urllib.error.HTTPError) else ""
            raise ServerError(f"POST {self.root}{path} failed: {exc} {detail} (server log: {self.log})") from exc
        return json.loads(raw) if raw.strip() else None

    def reset_prefix_cache(self) -> bool:
        """Drop the server's prefix cache (``POST /reset_prefix_cache``); ``True`` when it answered."""
        self.post("/reset_prefix_cache")
        return True

    def sync_weights(self, model: Any) -> dict[str, float]:
        """Load ``model``'s current weights into the server (module docstring); ``{"write_s", "load_s"}``."""
        from ..agents.vllm.weights import reload_on_server

        write_s, load_s = reload_on_server(self.post, model)
        self._weights_probe = weights_probe(model)
        self.reset_prefix_cache()
        return {"write_s": write_s, "load_s": load_s}

    def fingerprint(self) -> dict[str, Any]:
        """The agent's, with the probe of the weights last synced (``weights_probe``)."""
        synced = {} if self._weights_probe is None else {"weights_probe": self._weights_probe}
        return {**synced, **super().fingerprint()}

    def close(self) -> None:
        """Close the connections and stop the server this agent started (SIGTERM, then SIGKILL to its session)."""
        super().close()
        proc, self.process = self.process, None
        if proc is not None:
            stop_server(proc)


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM to a server process started with ``start_new_session`` (vLLM then ends its engine processes), then
    SIGKILL to its session if it is still there after 60 s. Nothing when it has ended."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # start_new_session: the group holds only what it started
            proc.wait(timeout=30)


def end_with_parent() -> None:
    """In the server's process before it starts (Linux): SIGTERM it when the run's process dies, also by SIGKILL
    (``prctl(PR_SET_PDEATHSIG)``), so a killed run leaves no server behind; elsewhere a no-op."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(python: str, model_dir: str, port: int, cfg: Any) -> list[str]:
    """The server's command line (module docstring). vLLM 0.32 on CPU dies on seeded requests whose prompts get
    prefilled in chunks (docs/guides/agents.md, vLLM): no chunking, and a token budget that holds a long prompt."""
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name",
            SERVED_NAME, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--logprobs-mode", "processed_logprobs", "--seed", str(cfg.seed),
            "--kv-cache-memory-bytes", str(int(cfg.kv_cache_gib * (1 << 30))),
            "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"]  # fmt: skip


def serve_policy(model: Any, tokenizer: Any, cfg: Any, log_dir: str | Path) -> ServedPolicy:
    """Start a vLLM server on ``model``'s current weights with ``cfg.server_python`` (default: this Python) and
    return the :class:`ServedPolicy` sampling from it as the run's transformers agent would (``--temperature``,
    ``--max-new-tokens`` a turn, ``--seed``). :class:`ServerError` (naming the log) when it exits or is not
    ready within :data:`STARTUP_S`."""
    from ..agents.sampling import SamplingConfig

    python = cfg.server_python or sys.executable
    weights = tempfile.mkdtemp(prefix="hf_rollouts_served_policy_")
    model.save_pretrained(weights)
    tokenizer.save_pretrained(weights)
    port, log = free_port(), Path(log_dir) / "vllm-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen(server_command(python, weights, port, cfg), stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True, preexec_fn=end_with_parent)  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, root, log)
    except BaseException:
        proc.terminate()
        proc.wait(timeout=60)
        raise
    finally:
        shutil.rmtree(weights, ignore_errors=True)  # loaded (or never will be)
    sampling = SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    return ServedPolicy(base_url=root + "/v1", model=SERVED_NAME, mode="tokens", logprobs_mode="processed",
                        seed=cfg.seed, timeout=600.0, sampling=sampling, tokenizer=tokenizer, root=root,
                        process=proc, log=log)  # fmt: skip


def wait_ready(proc: subprocess.Popen, root: str, log: Path) -> None:
    started = time.monotonic()
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise ServerError(
                f"the vLLM server exited with {proc.returncode} ({log}):\n{tail}\nIs vLLM installed in "
                "--server-python? (bash scripts/setup_vllm.sh --check prints the vLLM venv's.)"
            )
        try:
            with NO_PROXY.open(root + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() - started > STARTUP_S:
            raise ServerError(f"the vLLM server was not ready in {STARTUP_S:.0f} s (its log: {log}).")
        time.sleep(0.5)


__all__ = ["SERVED_NAME", "STARTUP_S", "ServedPolicy", "ServerError", "serve_policy", "server_command", "stop_server"]
