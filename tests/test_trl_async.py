"""TRL's asynchronous GRPO trainer (trl 1.16's ``trl.experimental.async_grpo``) on hf_rollouts envs, on this CPU
(hf_rollouts.integrations.trl.async_grpo): the reference tree attention against the model's own, a short run whose
rollouts come from :class:`EnvRolloutWorker` (a TransformersAgent on its own copy of the policy, synced by
:class:`CopyWeights`), the worker's refusals, and the TRL blockers the builder works around (so the guide's account
stays true: these tests fail once TRL runs on a CPU by itself). The vLLM server variant is in
tests/test_vllm_training.py.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")
pytestmark = pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning")

from hfr_vowels import ALLOWED, vowel_tasks  # noqa: E402

from hf_rollouts.integrations.trl.async_grpo import (  # noqa: E402
    TREE_ATTENTION,
    CopyWeights,
    EnvRolloutWorker,
    PolicyLock,
    build_async_grpo_trainer,
    tree_attention_reference,
)

G, GROUPS, STEPS, MAX_STALENESS = 4, 2, 4, 1
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def small_dir(_cache_dir):
    from hf_rollouts.tiny_model import build_tiny_model, tiny_model_path

    build_tiny_model(seed=0, size="small")
    return str(tiny_model_path(0, "small"))


def _sampler(path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rollouts.agents.hf import TransformersAgent

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tok, TransformersAgent(model, tok, temperature=TEMPERATURE, max_new_tokens=4, seed=0)


@pytest.fixture(scope="module")
def run(small_dir):
    sampler, tok, agent = _sampler(small_dir)
    lock = PolicyLock()
    worker = EnvRolloutWorker(
        vowel_tasks(4), agent, tok, num_generations=G, groups_per_batch=GROUPS, policy_lock=lock,
        allowed_env_modules=ALLOWED,
    )  # fmt: skip
    transfer = CopyWeights(sampler, lock)
    trainer = build_async_grpo_trainer(
        small_dir, worker, transfer, max_steps=STEPS, learning_rate=1e-3, max_staleness=MAX_STALENESS
    )
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    worker.stop()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return SimpleNamespace(
        trainer=trainer, worker=worker, transfer=transfer, sampler=sampler, logs=logs, initial=initial, seconds=seconds
    )


def test_reference_tree_attention_is_the_models_own_attention(small_dir):
    """Three samples sharing a prefix, packed into one TRL tree row (shared tokens forwarded once): the log-prob of
    every trained token under the reference tree attention equals the plain forward of its own sample."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from trl.experimental.async_grpo.packing import TreeRow

    AttentionInterface.register(TREE_ATTENTION, tree_attention_reference)
    torch.manual_seed(0)
    prefix = torch.randint(5, 900, (9,)).tolist()
    tails = [torch.randint(5, 900, (n,)).tolist() for n in (4, 7, 1)]
    row = TreeRow()
    for group, tail in enumerate(tails):
        ids = prefix + tail
        mask = [0] * 5 + [1] * (len(ids) - 5)  # the last prefix tokens are trained too, in every sample
        row.add({"input_ids": torch.tensor(ids), "completion_mask": torch.tensor(mask),
                 "old_log_probs": torch.zeros(len(ids)), "advantage": 1.0, "group_id": group})  # fmt: skip
    packed = row.pack()
    assert len(packed["input_ids"]) < sum(len(prefix) + len(t) for t in tails)  # the prefix is shared
    tree = AutoModelForCausalLM.from_pretrained(small_dir, dtype=torch.float32, attn_implementation=TREE_ATTENTION)
    plain = AutoModelForCausalLM.from_pretrained(small_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = tree.eval()(
            input_ids=packed["input_ids"][None], position_ids=packed["position_ids"][None],
            tree_kv_index=packed["tree_kv_index"], tree_cu_seqlens_q=packed["tree_cu_seqlens_q"],
            tree_cu_seqlens_k=packed["tree_cu_seqlens_k"], tree_max_seqlen_q=int(packed["tree_max_seqlens"][0]),
            tree_max_seqlen_k=int(packed["tree_max_seqlens"][1]),
        ).logits[0]  # fmt: skip
        got = torch.log_softmax(logits, -1)[packed["token_index"], packed["shift_labels"][packed["token_index"]]]
        want = []
        for tail in tails:
            ids = torch.tensor([prefix + tail])
            lp = torch.log_softmax(plain(input_ids=ids).logits[0, :-1], -1)
            want += lp[torch.arange(4, ids.shape[1] - 1), ids[0, 5:]].tolist()
    assert len(want) == len(got) == sum(len(prefix) + len(t) - 5 for t in tails)
    assert torch.allclose(got, torch.tensor(want), atol=1e-5)


def test_the_async_trainer_trains_on_rollouts_of_our_envs(run):
    print(f"\n{STEPS} steps in {run.seconds:.1f} s; worker {run.worker.stats}, versions {run.worker.batch_versions}")
    print(f"sends (s): {[round(s, 4) for s in run.transfer.seconds]}")
    for h in run.logs:
        print(
            {
                k: round(h[k], 6)
                for k in ("step", "loss", "grad_norm", "reward", "ratio", "kl", "sample/staleness_max")
                if k in h
            }
        )
    assert [h["step"] for h in run.logs] == list(range(1, STEPS + 1))
    assert run.worker.stats["error_episodes"] == 0 and run.worker.stats["samples"] >= STEPS * G * GROUPS
    assert len({h["reward"] for h in run.logs}) > 1 and any(h["loss"] != 0 for h in run.logs)
    final = run.trainer.model.state_dict()
    assert any(not torch.equal(final[k], run.initial[k]) for k in final)  # the updates moved the policy...
    sampled = run.sampler.state_dict()
    assert all(torch.equal(final[k], sampled[k]) for k in final)  # ...and every sync reached the sampler's copy
    assert len(run.transfer.seconds) == STEPS + 1  # the sync at train begin, then one per step


def test_first_step_scores_the_samplers_own_log_probs(run):
    """Step 1 trains on samples of the synced initial weights: TRL's recomputed log-probs (tree attention, temperature,
    our masks and log-prob alignment) are the sampler's to float32 rounding (ratio 1, KL 0)."""
    first = run.logs[0]
    assert first["sample/staleness_max"] == 0
    assert abs(first["ratio"] - 1) < 1e-5 and abs(first["kl"]) < 1e-6


def test_rollouts_overlap_training_within_the_staleness_bound(run):
    versions = run.worker.batch_versions
    assert versions[:2] == [1, 1]  # batch 2 was sampled while step 1 trained (the worker runs a batch ahead)
    assert versions == sorted(versions)
    assert all(h["sample/staleness_max"] <= MAX_STALENESS for h in run.logs)


def test_an_episode_of_several_samples_is_a_training_row_per_sample(small_dir):
    """Unlike a GRPOTrainer row, TRL's async trainer takes several rows per conversation (its own forks): each sample
    of an episode is queued with the episode's advantage, its ids, the agent's sampled tokens as the mask and the
    agent's log-probs there."""
    from hfr_vowels import VowelShareEnv
    from transformers import AutoTokenizer

    from hf_rollouts.rollout.recorder import EpisodeRecorder
    from hf_rollouts.types import Action

    tok = AutoTokenizer.from_pretrained(small_dir)
    env = VowelShareEnv(tok, {})
    episodes = []
    for texts, reward in ((("one", "two"), 1.0), (("one",), 0.0)):  # prompts that do not extend each other
        rec = EpisodeRecorder(env.chat)
        for i, text in enumerate(texts):
            prompt = env.chat.initial_ids([{"role": "user", "content": text}])
            ids = tok("ae", add_special_tokens=False)["input_ids"]
            rec.add_call(prompt, Action(text="ae", token_ids=ids, logprobs=[-0.5 - i] * len(ids)))
        episodes.append(rec.finish("done", reward))
    assert [e.num_samples for e in episodes] == [2, 1]
    worker = EnvRolloutWorker(
        vowel_tasks(1), None, tok, num_generations=2, queue_maxsize=8, allowed_env_modules=ALLOWED
    )
    worker._queue(episodes, group_id=7, version=3)
    rows = [worker.rollout_buffer.get_nowait() for _ in range(3)]
    assert worker.rollout_buffer.empty()
    for row, sample in zip(rows, [*episodes[0].samples, episodes[1].last_sample]):
        assert row.input_ids.tolist() == sample.full_token_ids and (row.group_id, row.model_version) == (7, 3)
        assert row.completion_mask.tolist() == sample.agent_token_mask and row.completion_mask.sum() == len(ids)
        want = [lp for lp, m in zip(sample.logprobs, sample.agent_token_mask) if m]
        assert row.old_log_probs[row.completion_mask == 1].tolist() == want
    assert [round(r.advantage, 4) for r in rows] == [1.0, 1.0, -1.0]  # GRPO over the group, per conversation
    assert rows[1].old_log_probs[rows[1].completion_mask == 1].tolist() == [-1.5] * len(ids)


def test_the_worker_refuses_an_agent_without_log_probs(small_dir):
    from transformers import AutoTokenizer

    from hf_rollouts.agents.scripted import ScriptedAgent

    tok = AutoTokenizer.from_pretrained(small_dir)
    worker = EnvRolloutWorker(vowel_tasks(1), ScriptedAgent(lambda m: "12"), tok, num_generations=2,
                              allowed_env_modules=ALLOWED)  # fmt: skip
    worker.start()
    worker._thread.join(timeout=120)
    with pytest.raises(RuntimeError, match="no log-probs: TRL's loss needs the sampler's"):
        worker.check_health(300)


def test_the_worker_stops_after_batches_of_error_episodes_only(small_dir):
    """An agent that always fails would leave TRL's trainer waiting on an empty queue: the worker stops instead."""
    from transformers import AutoTokenizer

    from hf_rollouts.agents.scripted import ScriptedAgent

    def down(messages):
        raise ConnectionError("the server is down")

    tok = AutoTokenizer.from_pretrained(small_dir)
    worker = EnvRolloutWorker(vowel_tasks(2), ScriptedAgent(down), tok, num_generations=2, allowed_env_modules=ALLOWED)
    worker.start()
    worker._thread.join(timeout=120)
    with pytest.raises(RuntimeError, match="every episode of the last 3 batches was an error.*the server is down"):
        worker.check_health(300)
    assert worker.stats == {"batches": 3, "episodes": 6, "error_episodes": 6, "samples": 0}


def test_a_temperature_other_than_the_samplers_is_refused(small_dir):
    _, tok, agent = _sampler(small_dir)
    worker = EnvRolloutWorker(vowel_tasks(1), agent, tok, num_generations=2, allowed_env_modules=ALLOWED)
    with pytest.raises(ValueError, match="samples at 0.8"):
        build_async_grpo_trainer(small_dir, worker, CopyWeights(agent.model, PolicyLock()), max_steps=1,
                                 temperature=1.0)  # fmt: skip


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU blockers")
def test_trl_itself_still_stops_on_a_cpu_where_the_builder_steps_in():
    """The blockers the builder works around (module docstring, 1 and 2), as TRL 1.16 raises them here."""
    from trl.experimental.async_grpo import async_grpo_trainer, packing

    with pytest.raises(AssertionError, match="not compiled with CUDA"):  # 1: trl/trainer/utils.py:1824
        async_grpo_trainer.get_peak_flops_per_device(SimpleNamespace(device=torch.device("cpu")), "float32")
    packing._flash_attn.cache_clear()
    # 2: FA3 from the Hub through `kernels` (not installed here: ModuleNotFoundError; offline: a hub error)
    with pytest.raises((ImportError, OSError, RuntimeError, ValueError)):
        packing._flash_attn()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without CUDA")
def test_the_gpu_checks_async_step_refuses_a_cpu_and_checks_its_arguments():
    """scripts/gpu_check.sh's ``async`` step runs scripts/trl_async_check.py, which is for CUDA: both say so here
    (exit 2, the CPU run named), and the script refuses a step count below 1."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHON": sys.executable}
    check = subprocess.run([sys.executable, "scripts/trl_async_check.py", "--model", "unused"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert check.returncode == 2 and "no CUDA device here" in check.stderr and "test_trl_async.py" in check.stderr
    gpu = subprocess.run(["bash", "scripts/gpu_check.sh", "async"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert gpu.returncode == 2 and "no CUDA device here" in gpu.stderr
    assert "async)" in (repo / "scripts" / "gpu_check.sh").read_text()  # the step exists, with its case
    sys.path.insert(0, str(repo / "scripts"))
    try:
        from trl_async_check import parse_args
    finally:
        sys.path.remove(str(repo / "scripts"))
    assert parse_args(["--model", "m", "--server", "http://h:1"]).server == "http://h:1"
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--steps", "0"])
