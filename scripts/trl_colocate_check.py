"""TRL's colocate mode with an hf_rollouts env, on whatever vLLM this Python has (the GPU check's ``colocate`` step).

``GRPOConfig(use_vllm=True, vllm_mode="colocate")`` through :func:`hf_rollouts.integrations.trl.build_grpo_trainer`:
the trainer's in-process ``vllm.LLM`` samples the agent turns (``VLLMColocateAgent``) and TRL syncs the weights
before each rollout call (its own sync on a GPU; ``reload_weights_sync`` on a CPU, where TRL's fails). A model
directory with only a config and a tokenizer (``--random-weights``) gets seeded random weights, saved to a
temporary directory for the engine. Prints a line per step: reward, TRL's logged sampler/trainer log-prob gap
(mean, max) and importance-ratio range, and which sync ran; exits 1 when a step logged no gap (vLLM did not sample)
or the gap exceeds ``--max-gap``::

    python scripts/trl_colocate_check.py --model .gpu_check/models/smollm2-135m --random-weights --steps 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Model directory (or config + tokenizer).")
    parser.add_argument("--random-weights", action="store_true", help="Seeded random weights from the config.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-gap", type=float, default=0.1, help="Largest per-token gap accepted (bf16: ~1e-2).")
    parser.add_argument("--memory", type=float, default=0.3, help="vllm_gpu_memory_utilization (the trainer's share).")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf_rollouts.envs.guess_number import GuessNumberEnv
    from hf_rollouts.integrations.trl import build_grpo_trainer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scratch = tempfile.TemporaryDirectory(prefix="trl_colocate_")
    path = args.model
    if args.random_weights:  # vLLM loads from files: save the seeded random model where it can
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model)).save_pretrained(scratch.name)
        tokenizer.save_pretrained(scratch.name)
        path = scratch.name
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tasks = GuessNumberEnv(tokenizer, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(4 * args.steps * 4)
    started = time.perf_counter()
    trainer, rollout = build_grpo_trainer(
        model, tokenizer, tasks, max_steps=args.steps, num_generations=4, tasks_per_step=4, max_new_tokens=8,
        learning_rate=1e-5, temperature=0.7, use_vllm=True, vllm_mode="colocate", vllm_max_model_length=1024,
        vllm_gpu_memory_utilization=args.memory, vllm_importance_sampling_mode="token_truncate",
    )  # fmt: skip
    generation = trainer.vllm_generation
    sync = "reload_weights_sync" if hasattr(generation, "sync_seconds") else "TRL's own"
    dtype = generation.llm.llm_engine.vllm_config.model_config.dtype
    print(f"colocate: trainer and engine built in {time.perf_counter() - started:.1f} s; engine dtype {dtype}; {sync}")
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    steps = [h for h in trainer.state.log_history if "reward" in h]
    ok = len(steps) == args.steps
    for h in steps:
        gap_mean = h.get("sampling/sampling_logp_difference/mean", float("nan"))
        gap_max = h.get("sampling/sampling_logp_difference/max", float("nan"))
        low = h.get("sampling/importance_sampling_ratio/min", float("nan"))
        high = h.get("sampling/importance_sampling_ratio/max", float("nan"))
        ok = ok and gap_max == gap_max and gap_max <= args.max_gap
        print(f"step {h['step']}: reward {h['reward']:.3f}, gap mean {gap_mean:.2e} max {gap_max:.2e}, "
              f"IS ratio [{low:.3f}, {high:.3f}]")  # fmt: skip
    print(f"colocate: {len(steps)} steps in {seconds:.1f} s, sampler {type(rollout.last_agent).__name__}: "
          f"{'OK' if ok else 'FAILED'}")  # fmt: skip
    scratch.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
