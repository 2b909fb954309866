"""TRL's asynchronous GRPO trainer with an hf_rollouts env on CUDA (the GPU check's ``async`` step).

:func:`hf_rollouts.integrations.trl.async_grpo.build_async_grpo_trainer` for ``--steps`` steps: the rollouts come
from an :class:`EnvRolloutWorker` (guess-the-number episodes) sampled by a TransformersAgent on its own CUDA copy of
the policy, synced by :class:`CopyWeights` after every step, while the trainer trains on the previous batch; or,
with ``--server URL``, by a running ``vllm serve`` (``VLLM_SERVER_DEV_MODE=1``, ``--logprobs-mode
processed_logprobs``) through :class:`ServerWeightReload`. TRL's FA3 tree attention runs where the ``kernels``
package can fetch it, else the reference one (printed). A model directory with only a config and a tokenizer
(``--random-weights``) gets seeded random weights, saved to a temporary directory (TRL loads from a path). Prints a
line per step (reward, gradient norm, PPO ratio, KL, staleness) and a closing line; exits 1 when a step is missing,
step 1's ratio (identical weights) is off by more than ``--max-gap`` or the sampler's copy does not end on the trained
weights. With random weights the rewards are mostly 0 (a zero gradient: the weights then stay put): the check is the
plumbing on CUDA and step 1's sampler/trainer agreement::

    python scripts/trl_async_check.py --model .gpu_check/models/smollm2-135m --random-weights --steps 3

Without CUDA it says so and exits 2 (the CPU run is tests/test_trl_async.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Model directory (or config + tokenizer).")
    parser.add_argument("--random-weights", action="store_true", help="Seeded random weights from the config.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--server", default=None, help="A running vLLM server's root URL (else a CUDA copy samples).")
    parser.add_argument("--max-gap", type=float, default=0.05, help="Largest |ratio - 1| accepted at step 1.")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    if not torch.cuda.is_available():
        print(f"trl_async_check: no CUDA device here (torch {torch.__version__}); on a CPU run "
              "tests/test_trl_async.py", file=sys.stderr)  # fmt: skip
        return 2
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.envs.guess_number import GuessNumberEnv
    from hf_rollouts.integrations.trl.async_grpo import (
        CopyWeights,
        EnvRolloutWorker,
        PolicyLock,
        ServerWeightReload,
        build_async_grpo_trainer,
    )

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    scratch = tempfile.TemporaryDirectory(prefix="trl_async_")
    path = args.model
    if args.random_weights:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model)).save_pretrained(scratch.name)
        tokenizer.save_pretrained(scratch.name)
        path = scratch.name
    tasks = GuessNumberEnv(tokenizer, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(8)
    lock, sampler = PolicyLock(), None
    if args.server:
        from hf_rollouts.agents.openai import OpenAIChatAgent

        agent = OpenAIChatAgent(
            base_url=args.server.rstrip("/") + "/v1", model=path, mode="tokens", logprobs_mode="processed",
            tokenizer=tokenizer, temperature=0.7, max_new_tokens=8,
        )  # fmt: skip
        transfer = ServerWeightReload(args.server)
    else:
        sampler = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("cuda").eval()
        agent = TransformersAgent(sampler, tokenizer, temperature=0.7, max_new_tokens=8, seed=0)
        transfer = CopyWeights(sampler, lock)
    worker = EnvRolloutWorker(tasks, agent, tokenizer, num_generations=4, groups_per_batch=2, policy_lock=lock)
    started = time.perf_counter()
    extra = {"vllm_server_base_url": args.server} if args.server else {}
    trainer = build_async_grpo_trainer(
        path, worker, transfer, max_steps=args.steps, learning_rate=1e-5, max_staleness=1, bf16=False, **extra
    )
    print(f"async: trainer built in {time.perf_counter() - started:.1f} s on {trainer.args.device}; tree attention "
          f"{trainer.tree_attention}; sampler {type(agent).__name__}, transfer {type(transfer).__name__}")  # fmt: skip
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    worker.stop()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    ok = len(steps) == args.steps and abs(steps[0].get("ratio", float("nan")) - 1) <= args.max_gap
    nan = float("nan")
    for h in steps:
        reward, ratio, kl = h.get("reward", nan), h.get("ratio", nan), h.get("kl", nan)
        stale, grad = h.get("sample/staleness_max", nan), h.get("grad_norm", nan)
        print(f"step {h['step']}: reward {reward:.3f}, grad norm {grad:.3g}, ratio {ratio:.6f}, kl {kl:.2e}, "
              f"staleness max {stale:.0f}")  # fmt: skip
    if sampler is not None:
        final, copy = trainer.model.state_dict(), sampler.state_dict()
        ok = ok and all(torch.equal(final[k].to(copy[k].device), copy[k]) for k in final)
    sends = [round(s, 3) for s in transfer.seconds]
    print(f"async: {len(steps)} steps in {seconds:.1f} s, worker {worker.stats}, batch versions "
          f"{worker.batch_versions}, sends {sends}: {'OK' if ok else 'FAILED'}")  # fmt: skip
    scratch.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
