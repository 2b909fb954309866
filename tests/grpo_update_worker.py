"""Run by tests/test_training_multiprocess.py: one ``grpo_update`` over saved prepared rollouts, in one process or in
each process of a ``torch.distributed.run`` / ``accelerate launch`` group; the main process saves the weights."""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from datasets import load_from_disk

from hf_rollouts.tiny_model import build_tiny_model
from hf_rollouts.training import UpdateConfig, grpo_update


def main(rows_dir: str, out: str) -> None:
    torch.set_num_threads(1)  # one summation order in every process
    model, tok = build_tiny_model(seed=0)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.5))
    config = UpdateConfig(minibatch_size=5, epochs=2, max_grad_norm=None)
    m = grpo_update(model, optimizer, load_from_disk(rows_dir), pad_token_id=tok.pad_token_id, config=config,
                    seed=3, accelerator=accelerator)  # fmt: skip
    if accelerator.is_main_process:
        weights = accelerator.unwrap_model(model).state_dict()
        torch.save({k: v.detach().cpu() for k, v in weights.items()}, out)
    print(f"process {accelerator.process_index} of {accelerator.num_processes}: {m.steps} steps", flush=True)
    print(f"loss {m.loss:.8f} clip {m.clip_fraction:.8f} grad_norm {m.grad_norm:.8f}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
