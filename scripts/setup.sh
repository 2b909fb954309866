#!/usr/bin/env bash
# Create .venv and install hf_rollouts with its test extra. Idempotent.
# torch is installed first, pinned to the CPU wheel, so no dependency can pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
.venv/bin/python -m pip install -q -e ".[test]"
