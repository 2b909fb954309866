"""Runs tests/test_verifiers.py in the isolated verifiers venv, where the main test venv cannot import verifiers.

verifiers 0.3 pins mcp<2 and the project's test extra has mcp>=2.3, so the two cannot share a venv.
``scripts/setup_verifiers.sh`` (run by ``scripts/test.sh``) builds a cached venv from the ``verifiers`` extra; this
test starts pytest on tests/test_verifiers.py with that venv's python (this checkout on PYTHONPATH) and fails if any
test fails or skips there.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="verifiers imports here: in-process")
def test_verifiers_adapter_in_its_own_venv():
    check = subprocess.run(["bash", str(REPO / "scripts" / "setup_verifiers.sh"), "--check"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    if check.returncode != 0:
        pytest.skip((check.stderr.strip().splitlines() or ["scripts/setup_verifiers.sh --check failed"])[-1])
    python = check.stdout.strip().splitlines()[-1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    target = str(REPO / "tests" / "test_verifiers.py")
    run = subprocess.run([python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    sys.stdout.write(run.stdout[-3000:])
    assert run.returncode == 0, f"tests/test_verifiers.py failed in {python}:\n{run.stdout[-6000:]}{run.stderr[-2000:]}"
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-2000:]
