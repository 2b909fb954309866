"""Trains with VLLMAgent sampling, in the isolated vLLM venv, and writes what it measured to a JSON file;
tests/test_vllm_training.py checks it.

Run as ``<vllm venv python> tests/vllm_training_worker.py MODEL_DIR OUT.json PART`` with ``PYTHONPATH=<checkout>``
(vLLM spawns its engine processes, hence the ``__main__`` guard). ``PART`` ``loop`` runs the first three below,
``colocate`` the last (a process of its own: TRL's colocated engine sets up torch.distributed in the process).

* ``sync``: one engine, a transformers copy of the same weights. Round 0's stored log-probs against the trainer's
  recomputation (identical weights: the agreement to expect); an update that moves the trainer's weights; a round
  sampled *without* a sync (the engine's old weights against the trainer's new ones); the sync; the same round
  again. The fingerprint and the prefix cache are read at each point.
* ``guide``: docs/guides/training.md's vLLM loop, run as the page has it.
* ``script``: ``scripts/train_grpo.py --backend vllm --logprob-gap`` for three rounds (its metrics rows), and
  ``resumed``: the same run stopped after round 0's checkpoint and resumed (the engine built on the restored weights).
* ``overlap`` (a process of its own): ``--max-staleness 1`` with the in-process engine for three rounds (held-out
  evaluations after each, checkpoints kept): the metrics rows, the recorded timeline, and each round's stored
  log-probs against the version it records recomputed from the checkpoints; the same run stopped after round 0 and
  resumed.
* ``served`` (a process of its own): ``--backend vllm-server`` (a vLLM server of the run's own, this Python's
  vLLM), synchronous with ``--logprob-gap``, and overlapped as ``overlap``.
* ``colocate``: TRL's ``GRPOTrainer`` in colocate mode through ``build_grpo_trainer`` for three steps: first TRL's
  own weight sync (which fails on vLLM's CPU backend: the error is recorded), then training with
  ``reload_weights_sync``; TRL's logged sampler/trainer gaps and importance ratios, and each sync's seconds.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "training.md"
GUIDE_MARKER = "<!-- run by tests/test_vllm_training.py::test_the_guides_vllm_loop_runs -->"
TEMPERATURE = 0.7


def sync_checks(model_dir: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from hf_rollouts.agents.hf import TransformersAgent
    from hf_rollouts.agents.sampling import SamplingConfig
    from hf_rollouts.agents.vllm import VLLMAgent
    from hf_rollouts.envs.mastermind import MastermindEnv
    from hf_rollouts.rounds import collect_rollouts
    from hf_rollouts.training import logprob_gap, prepare_rollouts, sft_update
    from hf_rollouts.types import AgentRequest

    out: dict = {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    agent = VLLMAgent(
        model=model_dir, dtype="float32", enforce_eager=True, logprobs_mode="processed", max_model_len=512, seed=0,
        engine_kwargs={"kv_cache_memory_bytes": 1 << 28},
        sampling=SamplingConfig(temperature=TEMPERATURE, max_new_tokens=8),
    )  # fmt: skip
    tok = agent.tokenizer
    tasks = MastermindEnv(tok, {"max_turns": 2}).get_train_dataset(4)

    def gap(rollouts) -> dict:
        rows = prepare_rollouts(rollouts, flatten=True, progress=False).dataset
        g = logprob_gap(model, rows, tok.pad_token_id)
        return {"tokens": g.tokens, "max_abs": g.max_abs, "mean_abs": g.mean_abs}

    msgs = [{"role": "user", "content": "Guess the code: four letters from A to F, and say why you chose them."}]
    request = AgentRequest(messages=msgs, prompt_token_ids=agent.chat.initial_ids(msgs), seed=5)

    def cached_after_repeat() -> list[int]:
        """Prompt tokens served from the prefix cache by two identical requests in turn."""
        counts = []
        for _ in range(2):
            before = agent.stats["cached_prompt_tokens"]
            agent.act(request)
            counts.append(agent.stats["cached_prompt_tokens"] - before)
        return counts

    out["prompt_tokens"] = len(request.prompt_token_ids)
    out["fingerprint_start"] = agent.fingerprint()
    round0 = collect_rollouts(tasks, agent, 4, seed=1)
    out["gap_same_weights"] = gap(round0)
    out["cached_before_sync"] = cached_after_repeat()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out["update_losses"] = sft_update(
        model, optimizer, prepare_rollouts(round0, flatten=True, progress=False), pad_token_id=tok.pad_token_id,
        steps=3, batch_size=8,
    )  # fmt: skip
    out["fingerprint_unsynced"] = agent.fingerprint()
    out["gap_without_sync"] = gap(collect_rollouts(tasks, agent, 4, seed=2))

    sync = agent.sync_weights(model)
    out["sync"] = {"tensors": sync.tensors, "bytes": sync.bytes, "write_s": sync.write_s, "load_s": sync.load_s,
                   "weights_probe": sync.weights_probe}  # fmt: skip
    out["transformers_probe"] = TransformersAgent(model, tok, temperature=TEMPERATURE).weights_probe()
    out["fingerprint_synced"] = agent.fingerprint()
    out["cached_after_sync"] = cached_after_repeat()
    out["gap_after_sync"] = gap(collect_rollouts(tasks, agent, 4, seed=2))
    again = agent.sync_weights(model)  # the same weights again: the same probe, the same agreement
    out["probe_resync"] = again.weights_probe
    out["gap_after_resync"] = gap(collect_rollouts(tasks, agent, 4, seed=3))
    agent.close()
    return out


def guide_block() -> str:
    """The code of the guide's vLLM loop (the block under :data:`GUIDE_MARKER`)."""
    text = GUIDE.read_text()
    found = re.search(re.escape(GUIDE_MARKER) + r"\n```python\n(.*?)\n```", text, re.S)
    if found is None:
        raise SystemExit(f"{GUIDE}: no python block under {GUIDE_MARKER}")
    return found.group(1)


def run_guide() -> dict:
    import contextlib
    import io

    stdout = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(stdout):
        exec(compile(guide_block(), f"{GUIDE}:vllm-loop", "exec"), {"__name__": "__main__"})
    return {"stdout": stdout.getvalue(), "seconds": time.perf_counter() - started}


def train_grpo_script():
    import importlib.util

    if "train_grpo" in sys.modules:
        return sys.modules["train_grpo"]
    path = Path(__file__).resolve().parents[1] / "scripts" / "train_grpo.py"
    spec = importlib.util.spec_from_file_location("train_grpo", path)
    script = importlib.util.module_from_spec(spec)
    sys.modules["train_grpo"] = script  # its dataclasses look their module up
    spec.loader.exec_module(script)
    return script


def script_args(out_dir: str, extra: tuple[str, ...] = (), backend: str = "vllm") -> list[str]:
    argv = ["--backend", backend, "--model-size", "small", "--iterations", "3", "--tasks-per-iter", "8"]
    argv += ["--num-rollouts", "4", "--max-turns", "2", "--low", "1", "--high", "3", "--max-new-tokens", "4"]
    return argv + ["--kv-cache-gib", "0.25", "--plot", "none", "--quiet", "--output-dir", out_dir, *extra]


def run_script(out_dir: str, extra: tuple[str, ...] = ()) -> list[dict]:
    script = train_grpo_script()
    script.train(script.parse_args(script_args(out_dir, ("--logprob-gap", *extra))))
    return json.loads((Path(out_dir) / "metrics.json").read_text())


OVERLAP = ("--max-staleness", "1", "--importance-sampling-cap", "2.0", "--eval-every", "1", "--eval-tasks", "4",
           "--checkpoint-every", "1", "--keep-checkpoints", "3", "--keep-rollouts")  # fmt: skip


def run_overlapped(model_dir: str, out_dir: str, extra: tuple[str, ...] = (), backend: str = "vllm") -> dict:
    """An overlapped run as ``train`` runs it, keeping the timeline; with each round's log-prob gap against the
    version it records, recomputed from the checkpoints (``round-R/model.safetensors`` is version R + 1,
    ``round-R/sampler/version-V.safetensors`` version V)."""
    import contextlib
    import dataclasses

    import torch
    from datasets import load_from_disk
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hf_rollouts import training
    from hf_rollouts.recipes.overlap import play_overlapped
    from hf_rollouts.recipes.train import ROUND_STEPS, finish, setup

    script = train_grpo_script()
    cfg = script.parse_args(script_args(out_dir, (*OVERLAP, *extra), backend))
    with training.flush_denormals(True), contextlib.ExitStack() as cleanup:
        parts = setup(cfg, cleanup)
        timeline = play_overlapped(parts, ROUND_STEPS)
        if cfg.stop_after_round is None:
            finish(parts, None)
    out = Path(out_dir)
    versions, gaps = {}, {}
    for ckpt in sorted((out / "checkpoints").glob("round-*")):
        versions[int(ckpt.name[6:]) + 1] = ckpt / "model.safetensors"
        for f in (ckpt / "sampler").glob("version-*.safetensors"):
            versions[int(f.stem[8:])] = f
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for folder in sorted((out / "rollouts").glob("iter*")):
        rollouts = load_from_disk(str(folder))
        (version,) = {v for row in rollouts["policy_versions"] for v in row}
        if version not in versions:
            continue
        model.load_state_dict(load_file(str(versions[version])), strict=False)  # tied lm_head: saved once
        rows = training.prepare_rollouts(rollouts, flatten=True, progress=False).dataset
        g = training.logprob_gap(model, rows, parts.tokenizer.pad_token_id)
        gaps[folder.name] = {"version": version, "tokens": g.tokens, "max_abs": g.max_abs}
    return {"rows": [dataclasses.asdict(s) for s in parts.history], "gaps": gaps,
            "timeline": {k: {str(i): v for i, v in getattr(timeline, k).items()}
                         for k in ("collect", "update", "evaluate")}}  # fmt: skip


def overlap_runs(model_dir: str, tmp: Path) -> dict:
    out = {"vllm": run_overlapped(model_dir, str(tmp / "overlap"))}
    stopped = str(tmp / "overlap_resumed")
    run_overlapped(model_dir, stopped, ("--stop-after-round", "0"))
    out["vllm_resumed"] = run_overlapped(model_dir, stopped, ("--resume",))
    return out


def served_runs(model_dir: str, tmp: Path) -> dict:
    out, server = {}, ("--server-python", sys.executable)
    script = train_grpo_script()
    script.train(script.parse_args(script_args(str(tmp / "served"), ("--logprob-gap", *server), "vllm-server")))
    out["server_sync"] = json.loads((tmp / "served" / "metrics.json").read_text())
    out["server"] = run_overlapped(model_dir, str(tmp / "served_overlap"), server, "vllm-server")
    return out


def trl_colocate(model_dir: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_rollouts.envs.guess_number import GuessNumberEnv
    from hf_rollouts.integrations.trl import build_grpo_trainer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(16)
    settings = {"learning_rate": 1e-2, "use_vllm": True, "vllm_mode": "colocate", "temperature": TEMPERATURE,
                "vllm_gpu_memory_utilization": 0.1, "vllm_max_model_length": 512,
                "vllm_importance_sampling_mode": "token_truncate"}  # fmt: skip
    started = time.perf_counter()
    trainer, rollout = build_grpo_trainer(
        model, tok, tasks, max_steps=3, num_generations=4, tasks_per_step=2, max_new_tokens=4, **settings
    )
    out: dict = {"build_s": time.perf_counter() - started}
    generation = trainer.vllm_generation
    out["engine_dtype"] = str(generation.llm.llm_engine.vllm_config.model_config.dtype)
    try:  # TRL's own colocate sync, as TRL calls it before each rollout
        type(generation).sync_weights(generation)
        out["trl_sync_error"] = None
    except Exception as exc:
        out["trl_sync_error"] = f"{type(exc).__name__}: {exc}"
    started = time.perf_counter()
    trainer.train()
    out["train_s"] = time.perf_counter() - started
    out["log_history"] = trainer.state.log_history
    out["sync_seconds"] = generation.sync_seconds
    out["agent"] = type(rollout.last_agent).__name__
    out["calls"] = rollout.calls
    return out


def main(model_dir: str, out_path: str, part: str) -> None:
    if part == "overlap":
        result = {"overlap": overlap_runs(model_dir, Path(out_path).parent)}
    elif part == "served":
        result = {"served": served_runs(model_dir, Path(out_path).parent)}
    elif part == "colocate":
        try:
            import trl  # noqa: F401
        except ImportError as exc:
            result = {"colocate": {"skipped": f"TRL is not in the vLLM venv ({exc}): bash scripts/setup_vllm.sh"}}
        else:
            result = {"colocate": trl_colocate(model_dir)}
    else:
        result = {"sync": sync_checks(model_dir), "guide": run_guide()}
        result["script"] = run_script(str(Path(out_path).parent / "train_grpo"))
        resumed = str(Path(out_path).parent / "train_grpo_resumed")  # stopped after round 0, resumed: a new engine
        run_script(resumed, ("--checkpoint-every", "1", "--stop-after-round", "0"))
        result["resumed"] = run_script(resumed, ("--checkpoint-every", "1", "--resume"))
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
