"""Thin runnable equivalent of `hf-rollouts tasks`.

python scripts/make_tasks.py --env mastermind --split eval --num-tasks 50 --output tasks/mm-eval
"""

import sys

from hf_rollouts.cli import cmd_tasks

if __name__ == "__main__":
    raise SystemExit(cmd_tasks(sys.argv[1:]))
