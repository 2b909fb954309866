"""Runs VLLMAgent in the isolated vLLM venv and writes what happened to a JSON file; tests/test_vllm_real.py checks it.

Run from the main test suite as ``<vllm venv python> tests/vllm_agent_worker.py MODEL_DIR OUT.json CLI_OUT_DIR``
with ``PYTHONPATH=<checkout>``. vLLM starts its engine with ``spawn`` on CPU, hence the ``__main__`` guard.

One engine serves every check below (building one takes tens of seconds); every engine output that becomes an
action is recorded verbatim (``records``) by wrapping :meth:`VLLMAgent._to_action`, the one place outputs become
actions, so the test compares the stored rollouts with what the engine returned. Then the CLI runs once with
``--model vllm:MODEL_DIR`` (a second engine) and its output directory is checked by the test.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil


def main(model_dir: str, out_path: str, cli_out: str) -> None:
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.agents.vllm import VLLMAgent
    from hf_rollouts.agents.vllm.engine import cpu_preload_libraries
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.types import AgentRequest

    result: dict = {"timings": {}}
    records: list[dict] = []
    original = VLLMAgent._to_action

    def recording(self, request, prompt, output):
        action = original(self, request, prompt, output)
        completion = output.outputs[0]
        records.append(
            {
                "sent": list(prompt),
                "engine_prompt_ids": list(output.prompt_token_ids),
                "token_ids": list(completion.token_ids),
                "logprobs": [at[t].logprob for t, at in zip(completion.token_ids, completion.logprobs)],
                "finish_reason": completion.finish_reason,
                "cached": output.num_cached_tokens,
                "seed": self.request_seed(request),
            }
        )
        return action

    VLLMAgent._to_action = recording
    result["ld_preload_before"] = os.environ.get("LD_PRELOAD")
    t = time.perf_counter()
    sampling = SamplingConfig(temperature=0.7, max_new_tokens=10)
    engine = {"dtype": "float32", "enforce_eager": True, "logprobs_mode": "processed", "max_model_len": 512}
    engine.update(cpu_preload=True, cpu_threads_bind="nobind", warmup=True)  # vLLM's auto would pin the worker
    agent = load_agent(f"vllm:{model_dir}", sampling, seed=0, engine=engine)  # the default block size: it must cache
    result["timings"]["engine_build_s"] = time.perf_counter() - t
    result["stats_after_warmup"] = dict(agent.stats)
    result["ld_preload_here"] = os.environ.get("LD_PRELOAD")
    result["preload_found"] = cpu_preload_libraries()
    result["engine_libraries"] = {}  # what each of the engine's processes (core, worker) mapped
    for child in psutil.Process().children(recursive=True):
        with open(f"/proc/{child.pid}/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
        result["engine_libraries"][child.name()] = sorted(p for p in paths if "tcmalloc" in p or "omp" in p)
        result.setdefault("engine_affinity", {})[child.name()] = sorted(os.sched_getaffinity(child.pid))
    result["affinity"] = sorted(os.sched_getaffinity(0))

    tok = agent.tokenizer
    eos = tok.eos_token_id
    tasks = MastermindEnv(tok, {"max_turns": 3}).get_train_dataset(4)
    t = time.perf_counter()
    ds = generate_rollouts(tasks, agent, 3, seed=0, progress=False, cache_dir=f"{cli_out}-cache")
    result["timings"]["generate_s"] = time.perf_counter() - t
    columns = ["padded_full_token_ids", "padded_full_attention_mask", "padded_agent_token_mask"]
    columns += ["padded_sampled_token_mask", "padded_logprobs", "statuses", "errors", "num_turns", "num_cut_turns"]
    result["rollouts"] = ds.select_columns(columns).to_dict()
    result["run_records"] = len(records)

    # a request alone, twice: the same seed gives the same ids and log-probs
    msgs = [{"role": "user", "content": "Guess the code."}]
    request = AgentRequest(messages=msgs, prompt_token_ids=agent.chat.initial_ids(msgs), seed=12345)
    first, second = agent.act(request)[0], agent.act(request)[0]
    result["repeat"] = [[first.token_ids, first.logprobs], [second.token_ids, second.logprobs]]
    other = agent.act(AgentRequest(messages=msgs, prompt_token_ids=request.prompt_token_ids, seed=54321))[0]
    result["other_seed_ids"] = other.token_ids
    result["get_action"] = agent.get_action(msgs)[0].token_ids is not None
    too_long = agent.submit(AgentRequest(messages=msgs, prompt_token_ids=[eos] * 600, seed=1)).exception()
    result["too_long"] = f"{type(too_long).__name__}: {too_long}"
    result["records"] = records
    result["describe"] = agent.describe()
    result["fingerprint"] = agent.fingerprint()
    result["stats"] = dict(agent.stats)
    result["stop_ids"] = list(agent.stop_ids)
    # stop strings: the engine stops on them (vLLM's detokenizer) and the ids are cut by hf_rollouts' rule
    from dataclasses import replace

    agent.sampling = replace(sampling, stop=["e"], max_new_tokens=24)
    result["stop_runs"] = []
    for k in range(6):
        before = len(records)
        action = agent.act(AgentRequest(messages=msgs, prompt_token_ids=request.prompt_token_ids, seed=1000 + k))[0]
        engine_out = records[before]
        result["stop_runs"].append(
            {
                "engine_ids": engine_out["token_ids"],
                "engine_logprobs": engine_out["logprobs"],
                "ids": action.token_ids,
                "logprobs": action.logprobs,
                "text": action.text,
                "stopped": action.stopped,
            }  # fmt: skip
        )
    agent.sampling = sampling
    agent.close()
    closed = agent.submit(request).exception()
    result["after_close"] = f"{type(closed).__name__}: {closed}"

    from hf_rollouts.cli import main as cli

    t = time.perf_counter()
    argv = ["generate", "--env", "mastermind", "--env-config", '{"max_turns": 2}', "--num-tasks", "2"]
    argv += ["--num-rollouts", "2", "--max-new-tokens", "8"]
    argv += ["--temperature", "0.8", "--model", f"vllm:{model_dir}", "--logprobs-mode", "processed"]
    argv += ["--engine-args", json.dumps({"dtype": "float32", "enforce_eager": True}), "--output", cli_out]
    argv += ["--cache-dir", f"{cli_out}-cache"]
    result["cli_exit"] = cli(argv)
    result["timings"]["cli_s"] = time.perf_counter() - t
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
