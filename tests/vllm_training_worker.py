"""Trains with VLLMAgent sampling, in the isolated vLLM venv, and writes what it measured to a JSON file;
tests/test_vllm_training.py checks it.

Run as ``<vllm venv python> tests/vllm_training_worker.py MODEL_DIR OUT.json`` with ``PYTHONPATH=<checkout>``
(vLLM spawns its engine processes, hence the ``__main__`` guard).

* ``sync``: one engine, a transformers copy of the same weights. Round 0's stored log-probs against the trainer's
  recomputation (identical weights: the agreement to expect); an update that moves the trainer's weights; a round
  sampled *without* a sync (the engine's old weights against the trainer's new ones); the sync; the same round
  again. The fingerprint and the prefix cache are read at each point.
* ``guide``: docs/guides/training.md's vLLM loop, run as the page has it.
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
    from hf_rollouts.training import collect_rollouts, logprob_gap, prepare_rollouts, sft_update
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


def main(model_dir: str, out_path: str) -> None:
    result = {"sync": sync_checks(model_dir), "guide": run_guide()}
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
