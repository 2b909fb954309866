"""LoRA against full weights in our GRPO loop, side by side in one process (issue 51, item 4): the update phase's
seconds a round and the checkpoint's size (weights or adapter, plus AdamW's state); with ``--backend vllm`` also the
sync phase's seconds a round and its bytes (full weights reloaded, or the adapter alone handed to the engine as a new
``LoRARequest``) and the sampler/trainer log-prob gap of every round (``--logprob-gap``).

Both runs play the same rounds (same model, task, seeds) with ``--keep-constant-groups``, so every round takes its
optimizer steps even when the rewards are all equal (the update's cost is what is measured, not learning). The runs
alternate round by round is not possible (each is its own run), so they go one after the other; run it on a quiet
machine, or read the ratio with the machine's load in mind::

    python scripts/benchmark_lora.py --model tiny --rounds 3
    python scripts/benchmark_lora.py --model smollm2 --rounds 2 --tasks-per-iter 4 --num-rollouts 4 --lora-rank 8
    <vllm venv python> scripts/benchmark_lora.py --backend vllm --model tiny --model-size small --rounds 3

(``--backend vllm`` runs in the vLLM venv, ``bash scripts/setup_vllm.sh``, with ``PYTHONPATH=<checkout>``.)

Prints a JSON object per run and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from hf_rollouts.agents.vllm.adapters import ADAPTER_FILE
from hf_rollouts.recipes.checkpoint import folder_bytes
from hf_rollouts.recipes.train import train
from hf_rollouts.recipes.train_config import TrainConfig


def run(args: argparse.Namespace, lora_rank: int, out: Path) -> dict:
    cfg = TrainConfig(model=args.model, env="arithmetic", iterations=args.rounds, tasks_per_iter=args.tasks_per_iter,
                      num_rollouts=args.num_rollouts, minibatch_size=args.tasks_per_iter * args.num_rollouts,
                      max_new_tokens=args.max_new_tokens, keep_constant_groups=True, lora_rank=lora_rank,
                      lr=args.lr, checkpoint_every=1, keep_checkpoints=1, quiet=True, plot="none",
                      output_dir=str(out), backend=args.backend, model_size=args.model_size,
                      logprob_gap=args.backend == "vllm")  # fmt: skip
    history = train(cfg)
    (last,) = (out / "checkpoints").glob("round-*")
    weights = last / ("adapter" if lora_rank else "model.safetensors")
    result = {
        "lora_rank": lora_rank,
        "update_s": [round(s.phases["update"], 3) for s in history],
        "update_s_median": statistics.median(s.phases["update"] for s in history),
        "collect_s_median": statistics.median(s.phases["collect"] for s in history),
        "checkpoint_bytes": folder_bytes(last),
        "weights_bytes": folder_bytes(weights) if weights.is_dir() else weights.stat().st_size,
        "optimizer_bytes": (last / "optimizer.pt").stat().st_size,
    }
    if args.backend == "vllm":
        result.update(
            sync_s=[round(s.phases["sync"], 3) for s in history],
            sync_s_median=statistics.median(s.phases["sync"] for s in history),
            sync_bytes=(weights / ADAPTER_FILE).stat().st_size if lora_rank else full_sync_bytes(cfg),
            gap_max_abs=max(s.logprob_gap["max_abs"] for s in history),
            gap_mean_abs=statistics.mean(s.logprob_gap["mean_abs"] for s in history),
        )
    return result


def full_sync_bytes(cfg: TrainConfig) -> int:
    """The bytes a full-weights sync writes for ``cfg``'s model (``checkpoint_tensors``: the state dict, a tied output
    layer included), from a fresh load of the same model."""
    from hf_rollouts.agents.loading import load_agent
    from hf_rollouts.agents.vllm.weights import checkpoint_tensors

    spec = "tiny-small" if cfg.model == "tiny" and cfg.model_size != "tiny" else cfg.model
    tensors = checkpoint_tensors(load_agent(spec, model_seed=cfg.seed).model)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks-per-iter", type=int, default=8)
    parser.add_argument("--num-rollouts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--backend", default="transformers", choices=("transformers", "vllm"))
    parser.add_argument("--model-size", default="tiny", help="build_tiny_model size (vLLM's CPU backend: small).")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="benchmark_lora_") as tmp:
        full = run(args, 0, Path(tmp) / "full")
        lora = run(args, args.lora_rank, Path(tmp) / "lora")
    for r in (full, lora):
        print(json.dumps({"model": args.model, "backend": args.backend, **r}))
    ratios = {"update_lora_over_full": lora["update_s_median"] / full["update_s_median"],
              "checkpoint_lora_over_full": lora["checkpoint_bytes"] / full["checkpoint_bytes"]}  # fmt: skip
    if args.backend == "vllm":
        ratios.update(sync_lora_over_full=lora["sync_s_median"] / full["sync_s_median"],
                      sync_bytes_lora_over_full=lora["sync_bytes"] / full["sync_bytes"],
                      collect_lora_over_full=lora["collect_s_median"] / full["collect_s_median"])  # fmt: skip
    print(json.dumps({"model": args.model, "backend": args.backend, **ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
