"""grpo_update in two CPU processes (gloo) equals one process: each process takes its share of every minibatch, the
loss is weighted by the minibatch's token count, and the averaged gradient is the one-process gradient.

As in tests/test_multiprocess.py, the two processes are started with torch.distributed.run: on CPU,
`accelerate launch --cpu --num_processes 2` starts a single process unless MPI is configured, and
`accelerate launch` runs torch.distributed.run underneath on GPUs."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import torch
from test_multiprocess import launch_env

from hf_rollouts.agents.hf import TransformersAgent
from hf_rollouts.envs.guess_number import GuessNumberEnv
from hf_rollouts.rounds import collect_rollouts
from hf_rollouts.tiny_model import build_tiny_model
from hf_rollouts.training import prepare_rollouts

WORKER = Path(__file__).resolve().parent / "grpo_update_worker.py"


def test_grpo_update_in_two_processes_equals_one(tiny, tmp_path):
    model, tok = tiny
    agent = TransformersAgent(model, tok, temperature=0.8, max_new_tokens=4, seed=0)
    tasks = GuessNumberEnv(tok, {"low": 1, "high": 3, "max_turns": 2}).get_train_dataset(4)
    rollouts = collect_rollouts(tasks, agent, 3, seed=5)
    rows = prepare_rollouts(rollouts, flatten=True, progress=False).dataset
    rows = rows.map(lambda r, i: {"advantage": [1.0, -0.5, 0.25][i % 3]}, with_indices=True)  # a signal in every row
    assert len(rows) == 12  # minibatches of 5, 5 and 2 rows: uneven shares across the two processes
    rows.save_to_disk(str(tmp_path / "rows"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    two = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(WORKER), str(tmp_path / "rows"), str(tmp_path / "two.pt")]  # fmt: skip
    two = subprocess.run(two, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "process 1 of 2: 6 steps" in two.stdout and "process 0 of 2: 6 steps" in two.stdout
    one = subprocess.run([sys.executable, str(WORKER), str(tmp_path / "rows"), str(tmp_path / "one.pt")],
                         env=launch_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert one.returncode == 0 and "process 0 of 1: 6 steps" in one.stdout, one.stderr[-3000:]
    initial = build_tiny_model(seed=0)[0].state_dict()
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert a.keys() == b.keys() == initial.keys()
    step = max(float((a[k] - initial[k]).abs().max()) for k in a)
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"one-process step {step:.3g}, two-process gap {gap:.3g}")
    assert step > 1e-3, step  # the update moved the weights
    assert gap < 1e-3 * step, (gap, step)  # and two processes moved them as one does (float rounding apart)
    # the metrics are the minibatches' own, over both processes' shares, in every process
    metrics = [
        [float(x) for x in re.findall(r"loss (\S+) clip (\S+) grad_norm (\S+)", r.stdout)[0]] for r in (one, two)
    ]
    assert re.findall(r"loss .*", two.stdout)[0] == re.findall(r"loss .*", two.stdout)[-1]
    for a1, b1 in zip(*metrics):
        assert abs(a1 - b1) < 1e-5 * max(1.0, abs(a1)), metrics
