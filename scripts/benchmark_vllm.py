"""VLLMAgent (vLLM's engine in this process) against TransformersAgent's ``generate`` backend: same tasks, model
and sampling settings, one run, side by side.

Run it with the vLLM venv's python (``bash scripts/setup_vllm.sh`` builds it and prints its path):

    PYTHONPATH=. ~/.cache/hf_rollouts/vllm-venv-0.32.0-r1/bin/python scripts/benchmark_vllm.py
    PYTHONPATH=. python scripts/benchmark_vllm.py --model Qwen/Qwen2.5-0.5B-Instruct --dtype bfloat16 \
        --tasks 64 --rollouts 8 --device cuda --engine-args '{"gpu_memory_utilization": 0.5}'
        # on a GPU machine with vLLM installed: both agents share the GPU, so leave room for the first

Default workload: ``scripts/benchmark.py``'s (Twenty Questions, 16 tasks x 4 rollouts, <= 8 turns, <= 24 new
tokens per turn, the embedded ``tiny-small`` Llama in float32). Rows:

* ``transformers generate``: ``TransformersAgent(backend="generate")`` (left-padded batched ``model.generate``,
  KV cache kept between turns), best over torch thread counts ``--threads`` x ``--repeats``;
* ``vllm (first run)``: ``VLLMAgent``'s first ``generate_rollouts`` after the engine is built (warm-up included);
* ``vllm``: the best of ``--repeats`` further runs, each after ``reset_prefix_cache()`` so no run reuses the
  previous run's prompts (within a run, later turns of an episode do hit the cache, as they would in use).

The engine's build time is printed apart. The two agents draw different random numbers, so their episodes (and
token counts) differ; compare generated tokens per second. Numbers vary on a shared machine; compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU backend otherwise reserves most memory


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--model", default=None, help="hub id or local path (default: the embedded tiny-small model)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None, help="TransformersAgent's device (default: accelerate's)")
    p.add_argument("--threads", default="1,2", help="torch thread counts for TransformersAgent (best of them)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--enforce-eager", action="store_true", default=None, help="vLLM: no CUDA graphs/compile")
    p.add_argument("--engine-args", default="{}", help="JSON of further VLLMSettings fields / engine arguments")
    return p.parse_args()


def agent_tokens(ds) -> int:
    return sum(sum(row) for rows in ds["padded_agent_token_mask"] for row in rows)


def timed(run) -> tuple[float, object]:
    start = time.perf_counter()
    value = run()
    return time.perf_counter() - start, value


def main() -> int:
    import json

    import torch
    from datasets import disable_progress_bars

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.agents.vllm import VLLMAgent, VLLMSettings
    from hf_rollouts.envs.twenty_questions import TwentyQuestionsEnv
    from hf_rollouts.pipeline import generate_rollouts
    from hf_rollouts.tiny_model import build_tiny_model, tiny_model_path

    args = parse_args()
    disable_progress_bars()
    if args.model is None:
        model, tok = build_tiny_model(size="small")
        path, name = str(tiny_model_path(0, "small")), "tiny-small (embedded)"
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = name = args.model
        tok = AutoTokenizer.from_pretrained(path)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
    tasks = TwentyQuestionsEnv(tok, {"max_turns": args.max_turns}).get_train_dataset(num_tasks=args.tasks)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens)
    episodes = args.tasks * args.rollouts
    rows = []
    tmp = tempfile.mkdtemp(prefix="hfr-bench-vllm-")
    runs = iter(range(10**6))

    def play(agent):
        return generate_rollouts(tasks, agent, args.rollouts, seed=0, cache_dir=f"{tmp}/{next(runs)}", progress=False)

    hf = TransformersAgent(model, tok, sampling, seed=0, backend="generate", device=args.device)
    best = (float("inf"), 0, None)
    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        for _ in range(args.repeats):
            seconds, ds = timed(lambda: play(hf))
            best = min(best, (seconds, n, ds), key=lambda b: b[0])
    rows.append(("transformers generate", best[0], agent_tokens(best[2]), f"{best[1]} torch threads"))
    torch.set_num_threads(max(int(t) for t in args.threads.split(",")))

    options = json.loads(args.engine_args)
    if args.enforce_eager is not None:
        options["enforce_eager"] = args.enforce_eager
    settings = VLLMSettings.from_dict(path, {"dtype": args.dtype, **options})
    build_s, vllm_agent = timed(lambda: VLLMAgent(settings, sampling=sampling))
    with vllm_agent:
        seconds, ds = timed(lambda: play(vllm_agent))
        rows.append(("vllm (first run)", seconds, agent_tokens(ds), "warm-up included"))
        best = (float("inf"), None)
        for _ in range(args.repeats):
            vllm_agent.reset_prefix_cache()
            seconds, ds = timed(lambda: play(vllm_agent))
            best = min(best, (seconds, ds), key=lambda b: b[0])
        stats, engine = dict(vllm_agent.stats), vllm_agent.engine_config
        rows.append(("vllm", best[0], agent_tokens(best[1]), f"best of {args.repeats}"))

    print(f"\nmodel {name}, {args.dtype}; {args.tasks} tasks x {args.rollouts} rollouts, <= {args.max_turns} turns, ")
    print(f"<= {args.max_new_tokens} new tokens per turn; vLLM engine built in {build_s:.1f} s\n")
    print("| agent | wall s | episodes/s | generated tok/s | agent tokens | note |")
    print("|---|---:|---:|---:|---:|---|")
    for label, seconds, tokens, note in rows:
        print(f"| {label} | {seconds:.2f} | {episodes / seconds:.2f} | {tokens / seconds:.1f} | {tokens} | {note} |")
    print(f"\nvLLM agent counters over all its runs: {stats}")
    print(f"vLLM engine as resolved: {engine}")
    hf_s, vllm_s = rows[0][1], rows[-1][1]
    print(f"vllm / transformers generate wall time: {vllm_s / hf_s:.2f}")
    return 0


if __name__ == "__main__":  # vLLM starts its engine processes with spawn, which re-imports this module
    raise SystemExit(main())
