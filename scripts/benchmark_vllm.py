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
* ``vllm VARIANT (first run)``: ``VLLMAgent``'s first ``generate_rollouts`` after the engine is built (the engine's
  own warm-up, and the agent's ``warmup`` when on, are in the build);
* ``vllm VARIANT``: the best of ``--repeats`` further runs, each after ``reset_prefix_cache()`` so no run reuses the
  previous run's prompts (within a run, later turns of an episode do hit the cache, as they would in use).

``--variants before,agent,eager+preload`` builds one engine per setup, one after the other, in this run (the parts:
:data:`VARIANT_PARTS`), so setups are compared side by side (docs/speed.md, "vLLM on a small CPU"):

    PYTHONPATH=. python scripts/benchmark_vllm.py --repeats 1 --threads 1 \
        --variants before,eager,eager+tcmalloc,eager+preload,eager+preload+warmup,eager+preload+nobind

The engine's build time is printed apart, and the load average after each row. The two agents draw different random
numbers, so their episodes (and token counts) differ; compare generated tokens per second. Numbers vary on a shared
machine; compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU backend otherwise reserves most memory


VARIANT_PARTS: dict[str, tuple[dict, dict]] = {
    # part of a --variants name -> (VLLMSettings fields, environment of the engine's processes)
    "agent": ({}, {}),  # VLLMAgent's defaults
    "before": (  # VLLMAgent's defaults before issue 51 (vLLM's auto thread binding, no preloads, no warm-up)
        {"enforce_eager": False, "cpu_preload": False, "cpu_threads_bind": "auto", "warmup": False},
        {},
    ),
    "eager": ({"enforce_eager": True}, {}),
    "compile": ({"enforce_eager": False}, {}),
    "preload": ({"cpu_preload": True}, {}),  # tcmalloc and Intel OpenMP, as the agent finds them
    "nopreload": ({"cpu_preload": False}, {}),
    "tcmalloc": ({"cpu_preload": False}, {"LD_PRELOAD": "tcmalloc"}),  # tcmalloc alone
    "warmup": ({"warmup": True}, {}),
    "nowarmup": ({"warmup": False}, {}),
    "nobind": ({"cpu_threads_bind": "nobind"}, {}),  # unpinned; the worker's threads: OMP_NUM_THREADS
    "autobind": ({"cpu_threads_bind": "auto"}, {}),  # vLLM's: pinned, one core kept for the scheduler
}
"""The parts a ``--variants`` entry is made of, joined with ``+`` (``eager+preload+warmup``); later parts win. A
part ``seqsN`` sets ``max_num_seqs=N``, ``kvN`` a KV cache of N GiB (``kv_cache_memory_bytes``)."""


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
    p.add_argument(
        "--variants",
        default="agent",
        help="comma-separated vLLM engine setups, each built and timed in turn in this run, made of the parts of "
        f"VARIANT_PARTS joined with '+' ({', '.join(VARIANT_PARTS)}, seqsN, kvN), e.g. 'before,eager+preload'",
    )
    return p.parse_args()


def variant(name: str) -> tuple[dict, dict]:
    """The VLLMSettings fields and the environment of a ``--variants`` entry."""
    options: dict = {}
    env: dict = {}
    for part in name.split("+"):
        if part.startswith("seqs") and part[4:].isdigit():
            options.setdefault("engine_kwargs", {})["max_num_seqs"] = int(part[4:])
        elif part.startswith("kv") and part[2:].isdigit():
            options.setdefault("engine_kwargs", {})["kv_cache_memory_bytes"] = int(part[2:]) << 30
        elif part in VARIANT_PARTS:
            more, more_env = VARIANT_PARTS[part]
            options.update(more)
            env.update(more_env)
        else:
            raise SystemExit(f"unknown variant part {part!r} in {name!r}: use {', '.join(VARIANT_PARTS)}, seqsN, kvN")
    return options, env


def agent_tokens(ds) -> int:
    return sum(sum(row) for rows in ds["padded_agent_token_mask"] for row in rows)


def timed(run, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    value = run(*args, **kwargs)
    return time.perf_counter() - start, value


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


class environment:
    """``os.environ`` updated within the block (``LD_PRELOAD: tcmalloc`` -> the library's path), then restored."""

    def __init__(self, changes: dict) -> None:
        self.changes, self.saved = changes, {}

    def __enter__(self) -> None:
        from hf_rollouts.agents.vllm.engine import cpu_preload_libraries

        for key, value in self.changes.items():
            self.saved[key] = os.environ.get(key)
            if key == "LD_PRELOAD":
                value = cpu_preload_libraries()[value] or ""
            os.environ[key] = value

    def __exit__(self, *exc) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
    rows.append(("transformers generate", best[0], agent_tokens(best[2]), f"{best[1]} torch threads", load()))
    torch.set_num_threads(max(int(t) for t in args.threads.split(",")))

    base = json.loads(args.engine_args)
    if args.enforce_eager is not None:
        base["enforce_eager"] = args.enforce_eager
    engines = []
    for label in args.variants.split(","):
        options, env = variant(label)
        extra = {**base.get("engine_kwargs", {}), **options.pop("engine_kwargs", {})}
        settings = VLLMSettings.from_dict(path, {"dtype": args.dtype, **base, **options, "engine_kwargs": extra})
        with environment(env):
            build_s, vllm_agent = timed(VLLMAgent, settings, sampling=sampling)
        with vllm_agent:
            seconds, ds = timed(play, vllm_agent)
            rows.append(
                (f"vllm {label} (first run)", seconds, agent_tokens(ds), f"engine built in {build_s:.1f} s", load())
            )
            best = (float("inf"), None)
            for _ in range(args.repeats):
                vllm_agent.reset_prefix_cache()
                seconds, ds = timed(play, vllm_agent)
                best = min(best, (seconds, ds), key=lambda b: b[0])
            rows.append((f"vllm {label}", best[0], agent_tokens(best[1]), f"best of {args.repeats}", load()))
            print(f"measured: {rows[-2]}\nmeasured: {rows[-1]}", flush=True)  # the table comes at the end
            engines.append((label, dict(vllm_agent.stats), vllm_agent.engine_config, env))

    print(f"\nmodel {name}, {args.dtype}; {args.tasks} tasks x {args.rollouts} rollouts, <= {args.max_turns} turns, ")
    print(f"<= {args.max_new_tokens} new tokens per turn; load average (1/5/15 min) after each row\n")
    hf_s = rows[0][1]
    print("| agent | wall s | / transformers | episodes/s | generated tok/s | agent tokens | note | load |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for label, seconds, tokens, note, at in rows:
        print(
            f"| {label} | {seconds:.2f} | {seconds / hf_s:.2f} | {episodes / seconds:.2f} | {tokens / seconds:.1f} "
            f"| {tokens} | {note} | {at} |"
        )
    for label, stats, engine, env in engines:
        print(f"\nvllm {label}: counters over its runs {stats}; environment {env or '-'}; engine as resolved {engine}")
    return 0


if __name__ == "__main__":  # vLLM starts its engine processes with spawn, which re-imports this module
    raise SystemExit(main())
