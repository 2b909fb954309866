"""Two processes give the same rows, in the same order, as one process.

On CPU, `accelerate launch --cpu --num_processes 2` starts a single process unless MPI
is configured, so the test launches two processes with torch.distributed.run (what
`accelerate launch` does on GPUs); hf_rollouts.distributed.process_state makes them a
gloo group. The test checks that both really ran. On a machine with fewer GPUs than ranks, both ranks and the
one-process run use the CPU (two ranks on one GPU fail: "invalid device ordinal"), so the three runs share a device
kind and their samples can be compared token for token.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from datasets import load_from_disk

ROOT = Path(__file__).resolve().parents[1]
ARGS = [
    "--env",
    "mastermind",
    "--num-tasks",
    "6",
    "--num-rollouts",
    "2",
    "--env-config",
    '{"max_turns": 3}',
    "--max-new-tokens",
    "8",
    "--shard-size",
    "2",
    "--batch-size",
    "2",
]


def launch_env() -> dict[str, str]:
    """The environment of the runs: CPU only where the machine has fewer GPUs than the two ranks."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if torch.cuda.device_count() < 2:
        env.update(ACCELERATE_USE_CPU="1", CUDA_VISIBLE_DEVICES="")
    return env


def test_two_cpu_processes_equal_one(tmp_path):
    with socket.socket() as s:  # a free port for the rendezvous, so parallel runs cannot collide
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        str(ROOT / "scripts" / "generate.py"),
    ]
    proc = subprocess.run(
        launch + ARGS + ["--output", str(tmp_path / "two"), "--cache-dir", str(tmp_path / "c2")],
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rollouts [process 1]" in proc.stderr  # a second process really expanded its block of shards
    assert proc.stdout.count("wrote 6 tasks x 2 rollouts") == 1  # only the main process saves and reports
    cli = [sys.executable, "-c", "from hf_rollouts.cli import main; raise SystemExit(main())", "generate", *ARGS]
    one_proc = subprocess.run(
        cli + ["--output", str(tmp_path / "one"), "--cache-dir", str(tmp_path / "c1")],
        env=launch_env(),  # the same device kind as the two ranks
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one_proc.returncode == 0, one_proc.stderr[-3000:]
    one, two = load_from_disk(str(tmp_path / "one")), load_from_disk(str(tmp_path / "two"))
    # same tasks, same order, same sampled tokens, masks, rewards and statuses
    assert one.remove_columns("padded_logprobs").to_list() == two.remove_columns("padded_logprobs").to_list()
    # log-probabilities agree up to float summation order (each CPU process runs with its own thread count)
    for a, b in zip(one["padded_logprobs"], two["padded_logprobs"]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)
    assert (tmp_path / "two" / "README.md").is_file()
