"""Rollout throughput, measured side by side in one run.

    python scripts/benchmark.py                       # default: Twenty Questions, 16 tasks x 4 rollouts, 8 turns, --size small
    python scripts/benchmark.py --device cuda --model Qwen/Qwen2-0.5B --random-weights --tasks 64 --rollouts 8 --backend both

Rows of the table (same tasks, model and sampling settings):

(a) one-by-one   the same environments, one conversation per model call (the seed's loop)
(b) hf_rollouts  generate_rollouts: Dataset.map, all live episodes sharing each generation call
(c) lower bound  the generation calls of (b) replayed straight on the model (same prompts, same number of
                 new tokens per call), with no env, tokenizer or dataset work

Also: ratios (a)/(b) and (b)/(c), peak RSS, and on-disk parquet bytes per stored token position.
Numbers vary run to run on a shared machine; compare ratios from the same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import disable_progress_bars

from hf_rollouts.agents.hf import SamplingConfig, TransformersAgent
from hf_rollouts.envs.twenty_questions import TwentyQuestionsEnv
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import parquet_files, save_rollouts
from hf_rollouts.types import AgentRequest


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--size", default="small", choices=["tiny", "small"], help="embedded model size (ignored with --model)")
    p.add_argument("--model", default=None, help="hub id or path; with --random-weights only its config is used")
    p.add_argument("--random-weights", action="store_true", help="build --model from its config with random weights")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: accelerate's device)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--backend", default="generate", choices=["generate", "continuous", "both"])
    p.add_argument("--skip-baseline", action="store_true", help="skip (a), e.g. for large workloads")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build_model(args):
    dtype = getattr(torch, args.dtype)
    if args.model is None:
        from hf_rollouts.models import build_tiny_model

        model, tok = build_tiny_model(seed=0, size=args.size)
        return model.to(dtype), tok, f"hf_rollouts tiny-{args.size} (random weights)"
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if args.random_weights:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model), dtype=dtype)
        return model, tok, f"{args.model} (random weights)"
    return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype), tok, args.model


class CallLog:
    """Wraps a TransformersAgent backend to log each generation call's prompts and new-token count."""

    def __init__(self, agent: TransformersAgent) -> None:
        self.calls: list[tuple[list[list[int]], int]] = []
        for name in ("_generate_padded", "_generate_continuous"):
            real = getattr(agent, name)

            def logged(prompts, _real=real):
                out = _real(prompts)
                steps = max(len(agent._cut_at_stop(ids, lps)[0]) for ids, lps in out)
                self.calls.append(([list(p) for p in prompts], steps))
                return out

            setattr(agent, name, logged)


@torch.inference_mode()
def replay(model, calls, pad_id: int, device, sampling: SamplingConfig) -> tuple[float, int]:
    """(c): the same generate calls on the bare model; returns (seconds, generated tokens)."""
    tokens = 0
    start = time.perf_counter()
    for prompts, steps in calls:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=0, max_new_tokens=steps, min_new_tokens=steps, pad_token_id=pad_id,
        )
        tokens += len(prompts) * steps
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def agent_tokens(padded_masks) -> int:
    return sum(sum(m) for group in padded_masks for m in group) if padded_masks and isinstance(padded_masks[0][0], list) else sum(map(sum, padded_masks))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    args = parse_args()
    disable_progress_bars()
    model, tok, model_name = build_model(args)
    env_config = {"max_turns": args.max_turns}
    tasks = TwentyQuestionsEnv(tok, env_config).get_train_dataset(args.tasks)
    backends = ["generate", "continuous"] if args.backend == "both" else [args.backend]
    episodes = args.tasks * args.rollouts
    print(f"workload: Twenty Questions, {args.tasks} tasks x {args.rollouts} rollouts = {episodes} episodes, "
          f"<= {args.max_turns} turns, <= {args.max_new_tokens} new tokens/turn; model {model_name}; torch threads {torch.get_num_threads()}")
    rows = []
    for backend in backends:
        sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed, backend=backend)
        agent = TransformersAgent(model, tok, sampling, device=args.device, name=model_name)
        env = TwentyQuestionsEnv(tok, env_config)
        warm_up = [{"role": "user", "content": "warm up"}]
        agent.act_batch([AgentRequest(warm_up, env.chat.initial_ids(warm_up))])

        if not args.skip_baseline:
            agent.set_seed(args.seed)
            start = time.perf_counter()
            out = env.run_trial(tasks["task_data"], agent, args.rollouts, max_concurrency=1)
            t_a = time.perf_counter() - start
            rows.append((f"(a) one-by-one [{backend}]", t_a, agent_tokens(out["padded_agent_token_mask"]), agent.generate_calls))

        log = CallLog(agent)
        calls_before = agent.generate_calls
        with tempfile.TemporaryDirectory() as cache:
            start = time.perf_counter()
            ds = generate_rollouts(tasks, agent, args.rollouts, seed=args.seed, batch_size=args.tasks, cache_dir=cache, progress=False)
            t_b = time.perf_counter() - start
            disk = sum(Path(f).stat().st_size for f in parquet_files(save_rollouts(ds, Path(cache) / "saved")))
        positions = sum(len(ids) for group in ds["padded_full_token_ids"] for ids in group)
        real_tokens = sum(sum(m) for group in ds["padded_full_attention_mask"] for m in group)
        gen_b = agent_tokens(ds["padded_agent_token_mask"])
        rows.append((f"(b) hf_rollouts [{backend}]", t_b, gen_b, agent.generate_calls - calls_before))

        t_c, gen_c = replay(agent.model, log.calls, tok.pad_token_id, agent.device, sampling)
        rows.append((f"(c) lower bound [{backend}]", t_c, gen_b, len(log.calls)))
        rows.append(("", 0, 0, 0))
        print(f"[{backend}] parquet: {disk} bytes for {positions} stored token positions "
              f"= {disk / positions:.2f} bytes/position ({disk / real_tokens:.2f} bytes per real token)")
        if not args.skip_baseline:
            print(f"[{backend}] (a)/(b) = {t_a / t_b:.2f}x faster than one-by-one")
        print(f"[{backend}] (b)/(c) = {t_b / t_c:.3f} (pipeline overhead over pure generation: {100 * (t_b / t_c - 1):+.1f}%)")

    print(f"\n{'run':<32}{'wall s':>9}{'episodes/s':>12}{'gen tok/s':>11}{'gen calls':>11}")
    for name, secs, toks, calls in rows:
        if not name:
            continue
        print(f"{name:<32}{secs:>9.2f}{episodes / secs:>12.2f}{toks / secs:>11.1f}{calls:>11}")
    print(f"\npeak RSS: {peak_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
