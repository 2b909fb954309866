"""TRL's ``AsyncGRPOTrainer`` against a real ``vllm serve`` on this CPU, with hf_rollouts envs, in the isolated vLLM
venv; writes what it measured to a JSON file that tests/test_vllm_training.py checks.

Run as ``<vllm venv python> tests/vllm_async_worker.py MODEL_DIR OUT.json async`` with ``PYTHONPATH=<checkout>``. It
starts one server the way TRL's documentation asks (``VLLM_SERVER_DEV_MODE=1``, ``--weight-transfer-config
'{"backend":"nccl"}'``; processed log-probs, float32), then:

* ``async``: :func:`~hf_rollouts.integrations.trl.async_grpo.build_async_grpo_trainer` for three steps: the rollouts
  from :class:`EnvRolloutWorker` with an ``OpenAIChatAgent`` (token mode) on the server, the weights through
  :class:`ServerWeightReload` (no NCCL). TRL's log rows, the worker's counts, each send's seconds.
* ``gap``: after training, the server samples a few answers; their log-probs against the trained weights and the
  initial ones (teacher-forced, same temperature): the reloads reached the server if the first is float32 rounding
  and the second is not.
* ``trl_nccl_error``: TRL's own ``WeightTransferClient.init_weight_transfer()`` against the same server, last (its
  NCCL side is left on a thread of its own): the error it stops with here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TEMPERATURE = 0.7


def start_server(model_dir: str, log: Path) -> tuple[subprocess.Popen, str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0"]
    cmd += ["--logprobs-mode", "processed_logprobs", "--block-size", "32", "--no-enable-chunked-prefill"]
    cmd += ["--max-num-batched-tokens", "4096", "--weight-transfer-config", '{"backend":"nccl"}']
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with opener.open(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc, url, time.monotonic() - started
        except OSError:
            pass
        if time.monotonic() - started > 600:
            proc.terminate()
            raise SystemExit(f"the vLLM server was not ready in 600 s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def gap(models: dict, agent, tok) -> dict:
    """Max |server log-prob - teacher-forced log-prob| of a few sampled answers, for each model."""
    import torch

    from hf_rollouts.types import AgentRequest

    out = {name: 0.0 for name in models}
    tokens = 0
    for k in range(4):
        msgs = [{"role": "user", "content": f"Say something ({k})."}]
        prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        action, _ = agent.act(AgentRequest(messages=msgs, prompt_token_ids=list(prompt), seed=k))
        ids = torch.tensor([list(prompt) + list(action.token_ids)])
        tokens += len(action.token_ids)
        for name, model in models.items():
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / TEMPERATURE
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            out[name] = max(out[name], float((lp - torch.tensor(action.logprobs)).abs().max()))
    return {**out, "tokens": tokens}


def trl_async(model_dir: str, url: str) -> dict:
    import torch
    from hfr_vowels import ALLOWED, vowel_tasks
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rollouts.agents.openai import OpenAIChatAgent
    from hf_rollouts.integrations.trl.async_grpo import EnvRolloutWorker, ServerWeightReload, build_async_grpo_trainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    agent = OpenAIChatAgent(
        base_url=url + "/v1", model=model_dir, mode="tokens", logprobs_mode="processed", tokenizer=tok,
        temperature=TEMPERATURE, max_new_tokens=4,
    )  # fmt: skip
    worker = EnvRolloutWorker(
        vowel_tasks(4), agent, tok, num_generations=4, groups_per_batch=2, allowed_env_modules=ALLOWED
    )
    transfer = ServerWeightReload(url)
    trainer = build_async_grpo_trainer(
        model_dir, worker, transfer, max_steps=3, learning_rate=1e-3, max_staleness=1, vllm_server_base_url=url
    )
    started = time.perf_counter()
    trainer.train()
    out = {"train_s": time.perf_counter() - started, "attention": trainer.tree_attention}
    worker.stop()
    out.update(log_history=trainer.state.log_history, sends=transfer.seconds, stats=worker.stats)
    out["batch_versions"] = worker.batch_versions
    trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    trained.load_state_dict(trainer.model.state_dict())
    initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out["gap"] = gap({"trained": trained, "initial": initial}, agent, tok)
    return out


def trl_nccl_error(model_dir: str, url: str) -> str | None:
    from transformers import AutoModelForCausalLM
    from trl.experimental.async_grpo.vllm_client import VLLMClient
    from trl.experimental.async_grpo.weight_transfer import WeightTransferClient

    params = list(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    info = {"names": [n for n, _ in params], "dtype_names": [str(p.dtype).split(".")[-1] for _, p in params],
            "shapes": [list(p.shape) for _, p in params]}  # fmt: skip
    client = WeightTransferClient(VLLMClient(url), info, weight_sync_timeout=120)
    try:
        client.init_weight_transfer()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc} <- {type(exc.__cause__).__name__}: {exc.__cause__}"
    return None


def main(model_dir: str, out_path: str, part: str) -> None:
    if part != "async":
        raise SystemExit(f"unknown part {part!r} (async)")
    try:
        import trl  # noqa: F401
    except ImportError as exc:
        Path(out_path).write_text(json.dumps({"async": {"skipped": f"TRL is not in the vLLM venv ({exc})"}}))
        return
    proc, url, startup = start_server(model_dir, Path(out_path).with_suffix(".server.log"))
    try:
        result = {"server_start_s": startup, **trl_async(model_dir, url)}
        result["trl_nccl_error"] = trl_nccl_error(model_dir, url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
    Path(out_path).write_text(json.dumps({"async": result}))
    os._exit(0)  # TRL's NCCL rendezvous thread is still waiting: do not join it


if __name__ == "__main__":
    main(*sys.argv[1:4])
