#!/usr/bin/env bash
# Set up, then run the test suite (offline: no hub is reachable or needed). What CI runs; each phase prints its time.
# Tests that play a real model for minutes are marked slow and left out (pyproject.toml's addopts); each has a fast
# twin on the tiny model. Run them with `.venv/bin/python -m pytest -m slow` (docs/contributing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
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
# The system Chromium and chromedriver for the viewer's browser tests (installed with apt-get where missing; where
# they cannot be, those tests skip and say why).
browser_started=$(date +%s)
if bash scripts/setup_browser.sh; then
    echo "browser ready ($(($(date +%s) - browser_started)) s)"
else
    echo "no browser after $(($(date +%s) - browser_started)) s: the viewer's browser tests will skip (see above)"
fi
# The cached lowest-versions venv: the version-sensitive tests run a second time at pyproject.toml's lowest supported
# transformers (what GPU images carry), so the declared range is the tested one. Where it cannot be built, that run is
# skipped and says so.
lowest_started=$(date +%s)
if lowest_python=$(bash scripts/setup_lowest.sh | tail -n 1); then
    echo "lowest-versions venv ready ($(($(date +%s) - lowest_started)) s)"
else
    echo "lowest-versions venv unavailable after $(($(date +%s) - lowest_started)) s: the suite runs at the newest" \
        "versions only, the lowest supported ones are NOT tested (see the reason above)"
    lowest_python=""
fi
echo "set-up done ($(($(date +%s) - started)) s)"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One torch (OpenMP) thread per test process, unless the caller says otherwise. The tests' models are tiny: a decode
# step is too small to gain from a second thread, and on a machine whose cores are taken by other jobs torch's threads
# wait for each other at every step. Measured on a shared 2-core machine (load ~20): a KV-cache test took 1.9 s at one
# thread and 150 s at two; the README example on the tiny model 7 s and 181 s. Tests that compare runs across
# processes already pin one thread (Ray workers, tests/test_multiprocess.py).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The suite. It builds the documentation site too (tests/test_site.py: `mkdocs build --strict`, offline; a broken link
# or anchor, a reference entry naming nothing, a docstring griffe cannot read fails it; then the built pages' checks).
status=0
suite_started=$(date +%s)
.venv/bin/python -m pytest -q "$@" || status=$?
echo "suite done ($(($(date +%s) - suite_started)) s)"
# At the lowest versions, only the files whose outcome can depend on the transformers (and torch) version run again:
# the ones that drive transformers itself (models, tokenizers and chat templates, generation, the sampler and the KV
# cache, stop strings, tools' templates and schemas, SmolLM2's loading, training, TRL, `transformers serve`). The
# rest (envs, the engine's scheduling, datasets and cards, executors, adapters, docs) runs the library's own code on
# top of those and gives the same answer at either end of the range; running it twice cost ~20 minutes per CI run.
# tests/test_ci.py checks that every test file that imports transformers is listed here.
LOWEST_TESTS=(
    tests/test_benchmark_bounds.py tests/test_chat.py tests/test_chat_templates.py tests/test_concurrency.py
    tests/test_env_core.py tests/test_kv_cache.py tests/test_model_verifiers.py tests/test_models.py tests/test_sampler.py
    tests/test_servers.py tests/test_viewer_edges.py
    tests/test_smollm2.py tests/test_stop_strings.py tests/test_tools.py tests/test_train_scripts.py
    tests/test_train_tools.py tests/test_training.py tests/test_training_loop.py tests/test_trl.py
    tests/test_trl_async.py
)
if [ -n "$lowest_python" ]; then
    echo "== the version-sensitive tests again at the lowest supported versions: $("$lowest_python" -c 'import torch
import transformers
print("transformers", transformers.__version__, "torch", torch.__version__)')"
    lowest_started=$(date +%s)
    PYTHONPATH="$PWD" "$lowest_python" -m pytest -q -p no:cacheprovider "${LOWEST_TESTS[@]}" "$@" || status=$?
    echo "lowest-versions run done ($(($(date +%s) - lowest_started)) s)"
fi
echo "scripts/test.sh took $(($(date +%s) - started)) s"
exit "$status"
