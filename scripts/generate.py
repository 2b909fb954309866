"""Thin runnable equivalent of `hf-rollouts generate`, for `accelerate launch`.

    accelerate launch --num_processes 2 scripts/generate.py --env mastermind --num-tasks 16 \
        --shard-size 8 --output out/mm
    torchrun --nproc_per_node 2 scripts/generate.py ...      # several CPU processes

Processes split the work by shards: keep num_tasks / shard_size >= the number of processes.

Every process loads its own model copy on its device and expands a contiguous
block of shards; the main process joins them in task order, saves and prints.
"""

import sys

from hf_rollouts.cli import cmd_generate

if __name__ == "__main__":
    raise SystemExit(cmd_generate(sys.argv[1:]))
