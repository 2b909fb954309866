#!/usr/bin/env bash
# Set up, then run the test suite (offline: no hub is reachable or needed).
set -euo pipefail
cd "$(dirname "$0")/.."
# the test extra, and the docs extra for the documentation build below
HF_ROLLOUTS_EXTRAS="${HF_ROLLOUTS_EXTRAS-test,docs}" bash scripts/setup.sh
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
# The cached lowest-versions venv: the suite runs a second time at pyproject.toml's lowest supported transformers (what
# GPU images carry), so the declared range is the tested one. Where it cannot be built, that run is skipped and says so.
lowest_started=$(date +%s)
if lowest_python=$(bash scripts/setup_lowest.sh | tail -n 1); then
    echo "lowest-versions venv ready ($(($(date +%s) - lowest_started)) s)"
else
    echo "lowest-versions venv unavailable after $(($(date +%s) - lowest_started)) s: the suite runs at the newest" \
        "versions only, the lowest supported ones are NOT tested (see the reason above)"
    lowest_python=""
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# the documentation site, strict: a broken link or anchor, a reference entry naming nothing, a docstring griffe
# cannot read fails the run (offline: nothing is fetched). The site goes to a temporary directory.
site_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site_dir"
rm -rf "$site_dir"
status=0
.venv/bin/python -m pytest -q "$@" || status=$?
if [ -n "$lowest_python" ]; then
    echo "== the suite again at the lowest supported versions: $("$lowest_python" -c 'import torch, transformers
print("transformers", transformers.__version__, "torch", torch.__version__)')"
    # the vLLM and verifiers tests run in venvs of their own (their own transformers): not again here
    PYTHONPATH="$PWD" HF_ROLLOUTS_SKIP_VLLM=1 HF_ROLLOUTS_SKIP_VERIFIERS=1 \
        "$lowest_python" -m pytest -q -p no:cacheprovider "$@" || status=$?
fi
exit "$status"
