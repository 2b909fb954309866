"""LoRA with vLLM sampling: the trained adapter reaches the engine (``VLLMAgent.sync_adapter``), the base weights stay.

Runs ``tests/vllm_lora_worker.py`` once in the isolated vLLM venv (``scripts/setup_vllm.sh``; every test here skips,
saying why, where it or peft is not there) with the embedded tiny-small model in float32, and checks its report:

* the adapter sync is **sufficient**: after an update of the adapter, the next round's engine log-probs equal the
  peft model's recomputation within the bound of identical weights (tests/test_vllm_training.py's ``GAP_BOUND``);
* it is **necessary**: the round sampled after the update but before the sync is far off, and so is the base model
  (adapter disabled) against the synced engine: the engine samples with the adapter;
* a sync moves the adapter alone (a small fraction of the model's bytes), one adapter stays in the engine, the
  base weights' checksums do not change, and the fingerprint moves to the transformers agent's probe;
* ``scripts/train_grpo.py --backend vllm --lora-rank 8`` runs, its rounds agreeing with the trainer.
"""

from __future__ import annotations

import pytest
from test_vllm_real import small, vllm_python  # noqa: F401 (fixtures)
from test_vllm_training import GAP_BOUND, _run_worker


@pytest.fixture(scope="module")
def lora_run(vllm_python, small, tmp_path_factory):  # noqa: F811
    run = _run_worker(vllm_python, small[0], tmp_path_factory.mktemp("vllm-lora"), "lora", "vllm_lora_worker.py")
    if getattr(run, "skipped", None):
        pytest.skip(run.skipped)
    return run


def test_adapter_sync_is_necessary_and_sufficient(lora_run):
    run = lora_run.sync
    fresh, stale, synced, base = (run[k] for k in ("gap_fresh_adapter", "gap_without_sync", "gap_after_sync",
                                                   "gap_base_model"))  # fmt: skip
    print(
        f"\nlog-prob gap, engine (adapter) vs peft trainer, max abs: fresh adapter {fresh['max_abs']:.2e}, after an "
        f"update without sync {stale['max_abs']:.2e}, after the sync {synced['max_abs']:.2e}, base model against "
        f"the synced engine {base['max_abs']:.2e}; sync of {run['sync2']['tensors']} tensors, "
        f"{run['sync2']['bytes']} bytes (full weights: {run['full_weights_bytes']}): "
        f"{run['sync2']['write_s']:.3f} s write + {run['sync2']['load_s']:.3f} s load"
    )
    bound = GAP_BOUND["torch.float32"]
    assert min(fresh["tokens"], stale["tokens"], synced["tokens"]) > 50
    assert fresh["max_abs"] < bound and synced["max_abs"] < bound
    assert run["update_losses"][0] > run["update_losses"][-1]  # the update moved the adapter
    assert stale["max_abs"] > 1000 * synced["max_abs"] and stale["mean_abs"] > 0.01
    assert base["max_abs"] > 1000 * synced["max_abs"]  # the engine samples with the adapter, not the base


def test_adapter_sync_moves_the_adapter_alone(lora_run):
    run = lora_run.sync
    assert [run["sync1"]["version"], run["sync2"]["version"]] == [1, 2] and run["loras"] == [2]  # old one removed
    assert 0 < run["sync2"]["bytes"] < run["full_weights_bytes"] / 4 and run["sync2"]["tensors"] > 0
    if isinstance(run["checksums_start"], str):
        pytest.skip(f"the engine cannot checksum its weights here: {run['checksums_start']}")
    assert run["checksums_after"] == run["checksums_start"]  # the base weights were never reloaded


def test_sync_adapter_moves_the_fingerprint(lora_run):
    run = lora_run.sync
    assert run["fingerprint_probe"] == run["sync2"]["weights_probe"] == run["transformers_probe"]
    assert run["sync1"]["weights_probe"] != run["sync2"]["weights_probe"]


def test_train_grpo_lora_with_vllm_syncs_the_adapter_every_round(lora_run):
    rows = lora_run.script
    for row in rows:
        print(f"round {row['iteration']}: gap {row['logprob_gap']}, phases {row['phases']}")
    assert len(rows) == 3 and all(set(row["phases"]) == {"collect", "gap", "update", "sync"} for row in rows)
    assert all(row["logprob_gap"]["tokens"] > 0 and row["logprob_gap"]["max_abs"] < GAP_BOUND["torch.float32"]
               for row in rows)  # fmt: skip
    assert any(row["trained_rollouts"] for row in rows[:-1])
    assert all(row["fingerprint_changed"] == bool(row["trained_rollouts"]) for row in rows)


@pytest.fixture(scope="module")
def colocate_lora_run(vllm_python, small, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("vllm-lora-colocate")
    run = _run_worker(vllm_python, small[0], tmp, "lora_colocate", "vllm_lora_worker.py")
    if getattr(run, "skipped", None):
        pytest.skip(run.skipped)
    return run.colocate


def test_trl_colocate_mode_with_peft_config_merges_the_adapter_for_each_sync(colocate_lora_run):
    """TRL 1.16 builds its colocated engine without LoRA, so a ``peft_config`` run syncs the adapter merged into the
    weights (``merged_tensors``): every step's sampler/trainer gap stays at the engine's rounding, the base weights
    of the trained model never move and the adapter does."""
    run = colocate_lora_run
    steps = [h for h in run["log_history"] if "sampling/sampling_logp_difference/max" in h]
    for h in steps:
        print({k: round(v, 6) for k, v in h.items() if k.startswith("sampling/") or k in ("reward", "step")})
    print(f"engine dtype {run['engine_dtype']}, LoRA in the engine: {run['engine_lora']}; syncs {run['sync_seconds']}")
    assert not run["engine_lora"] and run["calls"] == 3 and len(steps) == 3 and len(run["sync_seconds"]) == 3
    assert max(h["sampling/sampling_logp_difference/max"] for h in steps) < GAP_BOUND[run["engine_dtype"]]
    assert run["base_unchanged"] and run["lora_b_moved"] > 0
