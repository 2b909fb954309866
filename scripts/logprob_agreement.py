"""Sampler-trainer log-prob agreement: the gap between the stored sampling log-probs and the trainer's recomputed
ones (max and mean abs, per agent token), for each sampler and precision setting.

    python scripts/logprob_agreement.py                       # CPU: the embedded tiny-small model
    python scripts/logprob_agreement.py --device cuda --model PATH --random-weights

Samplers: ``generate`` is :class:`~hf_rollouts.agents.hf.TransformersAgent` (its per-request RowSampler, on the
device's decode cache); ``trl bridge`` is the TRL bridge's :class:`~hf_rollouts.integrations.trl.TrainerPolicyAgent`
(``generate``'s own sampling with ``output_logits``, autocast off, as inside ``GRPOTrainer``). Trainer settings:
the weights' dtype with no autocast, or float32 weights under ``torch.autocast(bfloat16)`` (what
``TrainingArguments(bf16=True)`` does to the forward). Each row samples Twenty Questions rollouts, saves and
prepares them as training rows, and recomputes them with :func:`hf_rollouts.training.logprob_gap`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from datasets import disable_progress_bars

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.envs.twenty_questions import TwentyQuestionsEnv
from hf_rollouts.integrations.trl.agents import TrainerPolicyAgent, TRLSampling
from hf_rollouts.pipeline import generate_rollouts
from hf_rollouts.publish import save_rollouts
from hf_rollouts.training import logprob_gap, prepare_rollouts

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: accelerate's device)")
    p.add_argument("--model", default=None, help="a path or hub id (default: the embedded tiny-small model)")
    p.add_argument("--random-weights", action="store_true", help="build --model from its config")
    p.add_argument("--dtypes", default="float32,bfloat16", help="weight dtypes to sample and train in")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=1.0)
    return p.parse_args()


def build(args) -> tuple[torch.nn.Module, object]:
    if args.model is None:
        from hf_rollouts.tiny_model import build_tiny_model

        return build_tiny_model(seed=0, size="small")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if args.random_weights:
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.model)), tok
    return AutoModelForCausalLM.from_pretrained(args.model), tok


def rows_of(agent, tasks, args, scratch: Path, name: str):
    rollouts = generate_rollouts(tasks, agent, args.rollouts, seed=0, cache_dir=scratch / name, progress=False)
    save_rollouts(rollouts, scratch / f"{name}_saved")
    return prepare_rollouts(scratch / f"{name}_saved", flatten=True, drop_constant_groups=False)


def main() -> int:
    args = parse_args()
    disable_progress_bars()
    base, tok = build(args)
    device = torch.device(args.device) if args.device else None
    env = TwentyQuestionsEnv(tok, {"max_turns": args.max_turns})
    tasks = env.get_train_dataset(args.tasks)
    t = args.temperature
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for dtype_name in args.dtypes.split(","):
            dtype = DTYPES[dtype_name]
            model = base.to(dtype)
            agent = TransformersAgent(model, tok, temperature=t, max_new_tokens=args.max_new_tokens, device=device)
            samplers = {
                f"generate (cache {agent.cache_kind})": agent,
                "trl bridge": TrainerPolicyAgent(model, tok, TRLSampling(t, 1.0, 0, 0.0, 1.0, args.max_new_tokens)),
            }
            for label, sampler in samplers.items():
                prepared = rows_of(sampler, tasks, args, scratch, f"{dtype_name}_{label.split()[0]}")
                trainers = {f"{dtype_name} weights, no autocast": (model, None)}
                if dtype == torch.float32:
                    trainers["float32 weights, autocast bfloat16"] = (model, torch.bfloat16)
                for trainer, (net, cast) in trainers.items():
                    gap = logprob_gap(
                        net, prepared.dataset, tok.pad_token_id, t, convention=prepared.logprob_convention,
                        autocast_dtype=cast,
                    )  # fmt: skip
                    results.append((label, dtype_name, trainer, gap))
    where = agent.device
    print(f"\nsampler-trainer log-prob gap on {where}, temperature {t}, |stored - recomputed| per agent token:")
    print("| sampler | sampling weights | trainer forward | agent tokens | max abs | mean abs |")
    print("|---|---|---|---:|---:|---:|")
    for label, dtype_name, trainer, gap in results:
        print(f"| {label} | {dtype_name} | {trainer} | {gap.tokens} | {gap.max_abs:.2e} | {gap.mean_abs:.2e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
