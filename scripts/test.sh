#!/usr/bin/env bash
# Set up, then run the test suite (offline: no hub is reachable or needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The isolated vLLM venv for the vLLM tests (cached between runs; a warm check takes seconds). Where it cannot be
# built, those tests skip and pytest's summary prints why (the reason is also in the line below).
vllm_started=$(date +%s)
if bash scripts/setup_vllm.sh >/dev/null; then
    echo "vLLM venv ready ($(($(date +%s) - vllm_started)) s)"
else
    echo "vLLM venv unavailable after $(($(date +%s) - vllm_started)) s: the vLLM tests will skip (see the reason above)"
fi
# The isolated verifiers venv (verifiers 0.3 pins mcp<2, the test extra has mcp>=2.3); cached like the vLLM one.
verifiers_started=$(date +%s)
if bash scripts/setup_verifiers.sh >/dev/null; then
    echo "verifiers venv ready ($(($(date +%s) - verifiers_started)) s)"
else
    echo "verifiers venv unavailable after $(($(date +%s) - verifiers_started)) s: its tests will skip (see above)"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q "$@"
