"""Thin runnable equivalent of `hf-rollouts inspect`.

python scripts/inspect_rollouts.py outputs/demo --row 0 --rollout 1
"""

import sys

from hf_rollouts.cli import cmd_inspect

if __name__ == "__main__":
    raise SystemExit(cmd_inspect(sys.argv[1:]))
