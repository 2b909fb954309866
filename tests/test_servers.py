"""OpenAIChatAgent against real inference servers on 127.0.0.1.

* :class:`vllm_protocol_server.VLLMProtocolServer`: vLLM's OpenAI protocol (the protocol
  files and commits it follows are listed in its docstring) over the tiny transformers
  model on CPU. Token mode is checked on every turn: the stored agent ids are the server's
  sampled ids, the server's prompt is the stored prefix, the stored log-probs are the
  server's, and there is no text fallback, also under a Qwen3-style template that rewrites
  history (which breaks chat mode on every later turn).
* ``transformers serve`` on the tiny model saved to a local directory (skipped without the
  serving extra): negotiation ends in chat mode, rollouts are text-only, and the CLI's
  ``--model openai:URL#MODEL`` works with no extra flag.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from vllm_protocol_server import VLLMProtocolServer

from hf_rollouts.agents.openai import OpenAIChatAgent
from hf_rollouts.envs.mastermind import MastermindEnv
from hf_rollouts.types import AgentRequest

QWEN3_STYLE_TEMPLATE = (
    # Qwen3's rule with enable_thinking=False, over the tiny tokenizer's role tokens: the generation
    # prompt opens an empty think block, and past assistant turns are rendered without it (and
    # without anything before '</think>'), so a re-rendered history differs from what was sampled.
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|assistant|>\\n' + message['content'].split('</think>')[-1].lstrip('\\n') + '<|end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
)
TASKS = [{"code": [1, 2, 3, 4]}, {"code": [4, 3, 2, 1]}]


@pytest.fixture(scope="module")
def qwen_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN3_STYLE_TEMPLATE
    return tok


def _rollouts(out):
    """Per rollout: (ids, agent mask, sampled mask, log-probs), trimmed to the real length."""
    for k, attn in enumerate(out["padded_full_attention_mask"]):
        n = sum(attn)
        lps = out["padded_logprobs"][k]
        yield (
            out["padded_full_token_ids"][k][:n],
            out["padded_agent_token_mask"][k][:n],
            out["padded_sampled_token_mask"][k][:n],
            None if lps is None else lps[:n],
        )


def _turn_spans(mask):
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def check_every_turn(out, server, endpoint):
    """Every stored agent turn is one logged server answer: same prompt, same ids, same log-probs."""
    log = [e for e in server.log if e["endpoint"] == endpoint]
    turns = 0
    for ids, mask, sampled, lps in _rollouts(out):
        assert sampled == mask  # every agent token is a sampled id, none re-tokenized text
        for s, e in _turn_spans(mask):
            turns += 1
            served = [x for x in log if x["prompt_ids"] == ids[:s] and x["token_ids"] == ids[s:e]]
            assert served, f"turn at {s}:{e} is not an answer the server sampled for the stored prefix"
            np.testing.assert_array_equal(np.float32(lps[s:e]), np.float32(served[0]["logprobs"]))
    return turns


# -- the vLLM-protocol server --------------------------------------------------------------------------
def test_token_mode_is_exact_on_every_turn_under_a_history_rewriting_template(tiny, qwen_tokenizer):
    model, _ = tiny
    with VLLMProtocolServer(model, qwen_tokenizer, logprobs_mode="processed_logprobs") as server:
        agent = OpenAIChatAgent(
            base_url=server.url,
            model="tiny",
            tokenizer=qwen_tokenizer,
            temperature=0.8,
            max_new_tokens=8,
            logprobs_mode="processed",  # with top_p=1: vLLM's processed log-probs are after top-p
        )
        out = MastermindEnv(qwen_tokenizer, {"max_turns": 3}).run_trial(TASKS, agent, num_rollouts=2)
        assert all(s in ("done", "truncated") for s in out["statuses"]), out["errors"]
        turns = check_every_turn(out, server, "completions")
    s = agent.stats
    assert turns == sum(out["num_turns"]) == s["requests"] and turns > len(TASKS) * 2  # later turns included
    assert s["token_exact"] == s["prompts_verified"] == turns and s["text_fallbacks"] == 0 and s["failures"] == 0
    assert s["probe_requests"] == 1 and agent.capabilities.mode == "tokens" and server.ignored_fields == []
    bodies = [e["body"] for e in server.log[1:]]
    assert all(b["stop_token_ids"] == [qwen_tokenizer.eos_token_id] and b["logprobs"] == 0 for b in bodies)
    assert len({b["seed"] for b in bodies}) == len(bodies)  # every turn of every rollout has its own seed
    assert agent.describe()["logprob_convention"] == {"kind": "processed", "temperature": 0.8}


def test_token_mode_keeps_the_sampled_stop_token(tiny, qwen_tokenizer):
    model, _ = tiny
    eos = qwen_tokenizer.eos_token_id
    with VLLMProtocolServer(model, qwen_tokenizer) as server:
        agent = OpenAIChatAgent(
            base_url=server.url,
            model="tiny",
            tokenizer=qwen_tokenizer,
            max_new_tokens=12,
            extra_body={"logit_bias": {str(eos): 4.0}},  # make the end-of-turn token likely (raw log-probs)
        )
        out = MastermindEnv(qwen_tokenizer, {"max_turns": 3}).run_trial(TASKS, agent, num_rollouts=2)
        turns = check_every_turn(out, server, "completions")  # the next prompt holds the stop id once, as sampled
    ends = [ids[e - 1] for ids, mask, _, _ in _rollouts(out) for _, e in _turn_spans(mask)]
    stopped = sum(1 for i in ends if i == eos)
    assert 0 < stopped < turns and stopped == turns - sum(out["num_cut_turns"])  # budget cuts are counted apart
    for ids, mask, _, _ in _rollouts(out):
        for _, e in _turn_spans(mask)[:-1]:
            if ids[e - 1] == eos:  # the template's closing continues after the sampled stop token, not doubled
                assert ids[e] != eos


def test_chat_mode_under_that_template_drops_later_turns_to_text(tiny, qwen_tokenizer):
    model, _ = tiny
    with VLLMProtocolServer(model, qwen_tokenizer) as server:
        agent = OpenAIChatAgent(
            base_url=server.url, model="tiny", tokenizer=qwen_tokenizer, max_new_tokens=8, mode="chat"
        )
        out = MastermindEnv(qwen_tokenizer, {"max_turns": 3}).run_trial(TASKS, agent, num_rollouts=2)
        chat_log = [e for e in server.log if e["endpoint"] == "chat"]
        for ids, mask, sampled, _ in _rollouts(out):
            for s, e in _turn_spans(mask):
                if sampled[s]:  # ids are kept only where the server's prompt was the stored prefix
                    assert any(x["prompt_ids"] == ids[:s] and x["token_ids"] == ids[s:e] for x in chat_log)
    s = agent.stats
    assert agent.capabilities.mode == "chat" and agent.capabilities.returns_prompt_ids
    later_turns = sum(out["num_turns"]) - len(out["num_turns"])
    assert later_turns > 0 and s["token_mismatches"] == s["text_fallbacks"] == later_turns  # every later turn
    assert s["token_exact"] == len(out["num_turns"])  # only first turns: the template rewrote every history


def test_raw_logprobs_are_recorded_as_raw(tiny, tokenizer):
    import torch

    model, _ = tiny
    with VLLMProtocolServer(model, tokenizer, logprobs_mode="raw_logprobs") as server:
        agent = OpenAIChatAgent(
            base_url=server.url, model="tiny", tokenizer=tokenizer, temperature=0.5, top_p=0.9, max_new_tokens=6
        )
        out = MastermindEnv(tokenizer, {"max_turns": 1}).run_trial(TASKS[:1], agent, num_rollouts=1)
        check_every_turn(out, server, "completions")
        assert server.log[-1]["params"]["top_p"] == 0.9  # sampled with top-p; raw log-probs do not see it
    ids, mask, _, lps = next(_rollouts(out))
    s, e = _turn_spans(mask)[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float().cpu()
    raw = torch.log_softmax(logits, -1)[torch.arange(s - 1, e - 1), torch.tensor(ids[s:e])]
    np.testing.assert_allclose(lps[s:e], raw.numpy(), rtol=1e-4, atol=1e-4)  # log_softmax(logits), not logits / 0.5
    assert agent.describe()["logprob_convention"] == {"kind": "raw", "temperature": 1.0}


NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def test_every_request_overrides_the_served_models_generation_config(tiny, tokenizer, tmp_path):
    """vLLM fills unset fields from generation_config.json (Qwen3: top_k 20): the agent leaves none unset."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tiny[0].save_pretrained(tmp_path)  # the tiny model's directory, shipping sampling defaults as Qwen3's does
    shipped = GenerationConfig(do_sample=True, top_k=3, min_p=0.2, repetition_penalty=1.5)
    shipped.save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    with VLLMProtocolServer(model, tokenizer, logprobs_mode="processed_logprobs") as server:
        assert server.defaults == {"top_k": 3, "min_p": 0.2, "repetition_penalty": 1.5}  # read from the directory
        agent = OpenAIChatAgent(
            base_url=server.url,
            model="tiny",
            tokenizer=tokenizer,
            temperature=0.8,
            max_new_tokens=6,
            logprobs_mode="processed",
        )
        out = MastermindEnv(tokenizer, {"max_turns": 2}).run_trial(TASKS, agent, num_rollouts=1)
        check_every_turn(out, server, "completions")
        chat = OpenAIChatAgent(base_url=server.url, model="tiny", tokenizer=tokenizer, max_new_tokens=4, mode="chat")
        chat.act(AgentRequest(messages=[{"role": "user", "content": "Guess."}], prompt_token_ids=[]))
    assert agent.capabilities.mode == "tokens" and chat.capabilities.mode == "chat"
    assert [e["endpoint"] for e in server.log].count("chat") == 2  # the chat agent's probe and its request
    for entry in server.log:  # probes and turns, both modes: the model's defaults never applied
        assert {k: entry["params"][k] for k in NEUTRAL} == NEUTRAL, entry["endpoint"]
    with torch.no_grad():  # so the stored log-probs are log_softmax(logits / T), as training recomputes them
        for ids, mask, _, lps in _rollouts(out):
            logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float().cpu() / 0.8
            want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            agent_pos = [i for i in range(1, len(ids)) if mask[i]]
            np.testing.assert_allclose(
                [lps[i] for i in agent_pos], want[[i - 1 for i in agent_pos]].numpy(), rtol=1e-4, atol=1e-4
            )


def test_an_old_vllm_without_return_token_ids_negotiates_chat(tiny, tokenizer):
    model, _ = tiny
    with VLLMProtocolServer(model, tokenizer, return_token_ids_supported=False) as server:
        agent = OpenAIChatAgent(base_url=server.url, model="tiny", tokenizer=tokenizer, max_new_tokens=6)
        out = MastermindEnv(tokenizer, {"max_turns": 2}).run_trial(TASKS, agent, num_rollouts=1)
    caps = agent.capabilities
    assert caps.mode == "chat" and not caps.returns_ids and caps.returns_logprobs and caps.source == "probe"
    assert [e["endpoint"] for e in server.log[:2]] == ["completions", "chat"] and agent.stats["probe_requests"] == 2
    assert all(s in ("done", "truncated") for s in out["statuses"]) and out["padded_logprobs"] == [None, None]
    assert agent.stats["text_fallbacks"] == agent.stats["requests"] > 0


def test_pipeline_fingerprint_and_card_record_the_negotiated_mode(tiny, tokenizer, tmp_path):
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.publish import render_card

    model, _ = tiny
    tasks = MastermindEnv(tokenizer, {"max_turns": 2}).get_train_dataset(2)
    with VLLMProtocolServer(model, tokenizer) as server:
        agent = OpenAIChatAgent(base_url=server.url, model="tiny", tokenizer=tokenizer, max_new_tokens=6)
        assert agent.fingerprint()["negotiated"]["mode"] == "tokens"  # the fingerprint probes first
        ds = generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path, progress=False)
        again = generate_rollouts(tasks, agent, 2, seed=0, cache_dir=tmp_path / "fresh", progress=False)
    assert all(s != "error" for row in ds["statuses"] for s in row)
    assert again["padded_full_token_ids"] == ds["padded_full_token_ids"]  # same per-request seeds, same samples
    card = str(render_card(ds, agent_info=agent.describe(), seed=0, pad_token_id=tokenizer.pad_token_id))
    assert '"mode": "tokens"' in card and "logprob_convention" in card


def _cli(*args, timeout=300):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-c", "from hf_rollouts.cli import main; raise SystemExit(main())", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_cli_token_mode_run_and_the_logprob_convention_in_training(tiny, tokenizer, tmp_path):
    import torch

    from hf_rollouts.tiny_model import tiny_model_path
    from hf_rollouts.training import prepare_rollouts, token_logprobs

    model, _ = tiny
    base = ["generate", "--env", "mastermind", "--num-tasks", "1", "--num-rollouts", "2", "--max-new-tokens", "6"]
    with VLLMProtocolServer(model, tokenizer, logprobs_mode="raw_logprobs") as server:  # vLLM's default
        run = _cli(
            *base,
            *("--temperature", "0.5", "--model", f"openai:{server.url}#tiny", "--tokenizer", str(tiny_model_path())),
            *("--output", str(tmp_path / "ok"), "--cache-dir", str(tmp_path / "cache")),
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mode tokens" in run.stdout and "text_fallbacks=0" in run.stdout and "failures=0" in run.stdout
    shown = _cli("inspect", str(tmp_path / "ok"))
    assert shown.returncode == 0 and "re-tokenized" not in shown.stdout
    prepared = prepare_rollouts(str(tmp_path / "ok"), flatten=True)
    convention = prepared.logprob_convention  # read back from the rows: the server's raw log-probs at temperature 1
    assert {k: convention[k] for k in ("kind", "temperature", "top_p", "top_k")} == {
        "kind": "raw",
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
    }
    assert len(convention["agents"]) == 1  # one agent made every row
    row = prepared.dataset[0]
    ids = torch.tensor([row["input_ids"]])
    with pytest.raises(ValueError, match=r"log_softmax\(logits / 1\).*temperature=0.5.*processed_logprobs"):
        token_logprobs(model, ids, temperature=0.5, convention=prepared.logprob_convention)
    with torch.no_grad():  # recomputed like the stored ones: the ratio is 1 on every agent token
        new = token_logprobs(model, ids, temperature=1.0, convention=prepared.logprob_convention)[0].cpu()
    agent = torch.tensor(row["agent_mask"]).bool()
    torch.testing.assert_close(new[agent], torch.tensor(row["old_logprobs"])[agent], rtol=1e-4, atol=1e-4)


def test_cli_exits_non_zero_when_every_episode_failed(tiny, tokenizer, tmp_path):
    from hf_rollouts.tiny_model import tiny_model_path

    model, _ = tiny
    base = ["generate", "--env", "mastermind", "--num-tasks", "1", "--num-rollouts", "2", "--max-new-tokens", "6"]
    with VLLMProtocolServer(model, tokenizer) as server:  # the probe passes, then every turn overflows the context
        too_long = [*base[:-2], "--max-new-tokens", "5000", "--model", f"openai:{server.url}#tiny"]
        failed = _cli(*too_long, "--tokenizer", str(tiny_model_path()), "--output", str(tmp_path / "bad"))
    assert failed.returncode == 1 and "every episode of this run failed (2 of 2)" in failed.stderr
    assert "context length" in failed.stderr and (tmp_path / "bad" / "README.md").is_file()  # saved all the same
    dead = _free_port()
    unreachable = [*base, "--model", f"openai:http://127.0.0.1:{dead}/v1#tiny", "--max-retries", "0"]
    failed = _cli(*unreachable, "--tokenizer", str(tiny_model_path()), "--output", str(tmp_path / "none"))
    assert failed.returncode == 1 and failed.stderr.startswith("error: ") and "ConnectError" in failed.stderr


# -- transformers serve ---------------------------------------------------------------------------
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
    path = str(tiny_model_path(0))  # the tiny model saved to a local directory
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-c", "from transformers.cli.transformers import main; main()", "serve", path]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--default-seed", "0"]
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


def test_transformers_serve_negotiates_chat_mode(transformers_server, tokenizer):
    url, model = transformers_server
    agent = OpenAIChatAgent(base_url=url, model=model, tokenizer=tokenizer, max_new_tokens=6, concurrency=4)
    out = MastermindEnv(tokenizer, {"max_turns": 2}).run_trial(TASKS, agent, num_rollouts=2)
    caps = agent.capabilities
    assert caps.mode == "chat" and caps.source == "probe" and "return_token_ids" in caps.dropped
    assert {"top_k", "min_p", "repetition_penalty"} <= set(caps.dropped)  # not OpenAI fields: 422, dropped
    assert "presence_penalty" not in caps.dropped and "frequency_penalty" not in caps.dropped  # OpenAI's own
    assert "return_token_ids" in caps.notes[0]  # the token probe's 422 named it
    assert not caps.returns_ids and not caps.returns_logprobs  # 'logprobs' is accepted and silently ignored
    assert all(s in ("done", "truncated") for s in out["statuses"]), out["errors"]
    assert out["padded_logprobs"] == [None] * 4 and all(sum(m) > 0 for m in out["padded_agent_token_mask"])
    s = agent.stats
    assert s["requests"] == s["text_fallbacks"] == sum(out["num_turns"]) and s["failures"] == 0
    assert s["probe_requests"] == 3  # token probe (422), chat probe (422 names return_token_ids), chat probe again


def test_cli_against_transformers_serve_needs_no_extra_flag(transformers_server, tmp_path):
    url, model = transformers_server
    run = _cli(
        *("generate", "--env", "mastermind", "--num-tasks", "1", "--num-rollouts", "1", "--max-new-tokens", "4"),
        *("--model", f"openai:{url}#{model}", "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")),
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "mode chat" in run.stdout
    shown = _cli("inspect", str(tmp_path / "out"))
    assert shown.returncode == 0 and "re-tokenized from text" in shown.stdout  # chat mode: text, tokenized once


def test_token_mode_stop_strings_store_every_sampled_id(tiny, tokenizer):
    """vLLM keeps every sampled id of a stop-string stop (the text alone is cut): all are stored as sampled, the env
    parses text that holds the stop string, and the next turn's prompt continues the stored ids."""
    model, _ = tiny
    with VLLMProtocolServer(model, tokenizer) as server:
        agent = OpenAIChatAgent(
            base_url=server.url, model="tiny", tokenizer=tokenizer, max_new_tokens=12, stop=["e", "o "]
        )
        env = MastermindEnv(tokenizer, {"max_turns": 3})
        out = env.run_trial(TASKS, agent, num_rollouts=2)
        assert all(s in ("done", "truncated") for s in out["statuses"]), out["errors"]
        turns = check_every_turn(out, server, "completions")  # stored ids == the server's ids, prompt == prefix
        answers = [e for e in server.log[1:] if e["endpoint"] == "completions"]
    assert turns == len(answers) and all(
        e["body"]["stop"] == ["e", "o "] and e["body"]["include_stop_str_in_output"] for e in answers
    )
    by_string = [e for e in answers if any(s in tokenizer.decode(e["token_ids"]) for s in ("e", "o "))]
    assert by_string  # some turns ended on a stop string ...
    texts = [m["content"] for row in out["conversations"] for m in row if m["role"] == "assistant"]
    assert all(tokenizer.decode(e["token_ids"], skip_special_tokens=True) in texts for e in by_string)
    assert agent.stats["token_exact"] == turns and server.ignored_fields == []
