"""LoRA with VLLMAgent sampling, in the isolated vLLM venv; writes what it measured to a JSON file that
tests/test_vllm_lora.py checks.

Run as ``<vllm venv python> tests/vllm_lora_worker.py MODEL_DIR OUT.json [PART]`` with ``PYTHONPATH=<checkout>`` (vLLM
spawns its engine processes, hence the ``__main__`` guard).

* ``sync``: one engine on the base weights with LoRA on, a peft copy of the same model (rank 8, ``all-linear``, as
  ``--lora-rank`` builds it). The fresh adapter synced (version 1: B = 0, the base policy) and round 0's engine
  log-probs against the peft model's; an update of the adapter; a round sampled *without* a sync; the sync
  (version 2: its bytes and seconds, the engine's adapters, the base weights' checksums before and after); the
  same round again.
* ``script``: ``scripts/train_grpo.py --backend vllm --lora-rank 8 --logprob-gap`` for three rounds (its metrics
  rows).
* ``PART`` ``lora_colocate`` (a process of its own: TRL's colocated engine sets up torch.distributed): TRL's
  ``GRPOTrainer`` in colocate mode with ``peft_config`` through ``build_grpo_trainer`` for three steps; the adapter
  is merged into the engine's weights for each sync (TRL builds its engine without LoRA).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vllm_training_worker import TEMPERATURE, run_script

RANK = 8


def engine_checksums(agent) -> object:
    """The engine's weight checksums (``AsyncLLM.compute_weight_checksums``), or the error that stops them."""
    from hf_rollouts.aio import ENGINE_LOOP

    try:
        return ENGINE_LOOP.call(agent._engine.compute_weight_checksums())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def sync_checks(model_dir: str) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.agents.vllm import VLLMAgent, lora_engine_kwargs
    from hf_rollouts.aio import ENGINE_LOOP
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.rounds import collect_rollouts
    from hf_rollouts.training import logprob_gap, prepare_rollouts, sft_update

    out: dict = {}
    agent = VLLMAgent(
        model=model_dir, dtype="float32", enforce_eager=True, logprobs_mode="processed", max_model_len=512, seed=0,
        engine_kwargs={"kv_cache_memory_bytes": 1 << 28, **lora_engine_kwargs(RANK)},
        sampling=SamplingConfig(temperature=TEMPERATURE, max_new_tokens=8),
    )  # fmt: skip
    tok = agent.tokenizer
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear",
                                            lora_dropout=0.0, task_type="CAUSAL_LM"))  # fmt: skip
    model.eval()
    tasks = MastermindEnv(tok, {"max_turns": 2}).get_train_dataset(4)
    out["full_weights_bytes"] = sum(p.numel() * p.element_size() for p in base.state_dict().values())

    def gap(rollouts) -> dict:
        rows = prepare_rollouts(rollouts, flatten=True, progress=False).dataset
        g = logprob_gap(model, rows, tok.pad_token_id)
        return {"tokens": g.tokens, "max_abs": g.max_abs, "mean_abs": g.mean_abs}

    def record(sync) -> dict:
        return {"version": sync.version, "tensors": sync.tensors, "bytes": sync.bytes, "write_s": sync.write_s,
                "load_s": sync.load_s, "weights_probe": sync.weights_probe}  # fmt: skip

    out["checksums_start"] = engine_checksums(agent)
    out["sync1"] = record(agent.sync_adapter(model))
    out["gap_fresh_adapter"] = gap(collect_rollouts(tasks, agent, 4, seed=1))
    round0 = collect_rollouts(tasks, agent, 4, seed=1)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    out["update_losses"] = sft_update(
        model, optimizer, prepare_rollouts(round0, flatten=True, progress=False), pad_token_id=tok.pad_token_id,
        steps=3, batch_size=8,
    )  # fmt: skip
    model.eval()
    out["gap_without_sync"] = gap(collect_rollouts(tasks, agent, 4, seed=2))
    out["sync2"] = record(agent.sync_adapter(model))
    out["transformers_probe"] = TransformersAgent(base, tok, temperature=TEMPERATURE).weights_probe()
    out["fingerprint_probe"] = agent.fingerprint().get("weights_probe")
    out["loras"] = sorted(ENGINE_LOOP.call(agent._engine.list_loras()))
    out["gap_after_sync"] = gap(collect_rollouts(tasks, agent, 4, seed=2))
    out["checksums_after"] = engine_checksums(agent)
    with model.disable_adapter():  # the base policy: the engine samples with the adapter, so this is far off
        out["gap_base_model"] = gap(collect_rollouts(tasks, agent, 4, seed=2))
    agent.close()
    return out


def trl_colocate_lora(model_dir: str) -> dict:
    """TRL's GRPOTrainer in colocate mode with ``peft_config`` (build_grpo_trainer): three steps, the adapter merged
    into the weights for each sync (:func:`~hf_rollouts.integrations.trl.colocate.merged_tensors`)."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rollouts.envs.guess_number import GuessNumberEnv
    from hf_rollouts.integrations.trl import build_grpo_trainer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    tok = AutoTokenizer.from_pretrained(model_dir)
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(16)
    settings = {"learning_rate": 1e-2, "use_vllm": True, "vllm_mode": "colocate", "temperature": TEMPERATURE,
                "vllm_gpu_memory_utilization": 0.1, "vllm_max_model_length": 512,
                "vllm_importance_sampling_mode": "token_truncate"}  # fmt: skip
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules="all-linear", lora_dropout=0.0,
                        task_type="CAUSAL_LM")  # fmt: skip
    trainer, rollout = build_grpo_trainer(model, tok, tasks, max_steps=3, num_generations=4, tasks_per_step=2,
                                          max_new_tokens=4, peft_config=config, **settings)  # fmt: skip
    generation = trainer.vllm_generation
    out: dict = {"engine_dtype": str(generation.llm.llm_engine.vllm_config.model_config.dtype),
                 "engine_lora": generation.llm.llm_engine.vllm_config.lora_config is not None}  # fmt: skip
    trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    after = {n.removeprefix("base_model.model.").replace(".base_layer", ""): p
             for n, p in trained.state_dict().items() if "lora_" not in n}  # fmt: skip
    out["base_unchanged"] = after.keys() == base.keys() and all(torch.equal(base[k], after[k]) for k in base)
    out["lora_b_moved"] = sum(int(p.abs().sum() > 0) for n, p in trained.named_parameters() if "lora_B" in n)
    out["log_history"] = trainer.state.log_history
    out["sync_seconds"] = generation.sync_seconds
    out["calls"] = rollout.calls
    return out


def main(model_dir: str, out_path: str, part: str = "lora") -> None:
    try:
        import peft  # noqa: F401
    except ImportError as exc:
        result = {"skipped": f"peft is not in the vLLM venv ({exc}): bash scripts/setup_vllm.sh"}
    else:
        if part == "lora_colocate":
            result = {"colocate": trl_colocate_lora(model_dir)}
        else:
            result = {"sync": sync_checks(model_dir)}
            result["script"] = run_script(str(Path(out_path).parent / "train_grpo_lora"), ("--lora-rank", str(RANK)))
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
