#!/usr/bin/env bash
# Build the isolated venv that the verifiers adapter's tests run in. Idempotent and cached.
#
# verifiers 0.3.x (the classic API the adapter drives; 0.4 removed it) pins mcp<2, and the project's test extra has
# mcp>=2.3 (hf_rollouts' MCP tools use mcp 2's Client). pip cannot put both in one venv, so verifiers gets its own,
# cached under
#     ${HF_ROLLOUTS_VERIFIERS_VENV:-${XDG_CACHE_HOME:-~/.cache}/hf_rollouts/verifiers-venv-r<recipe>}
# with the CPU torch, this checkout's dependencies, its `verifiers` extra (read from pyproject.toml) and pytest.
# hf_rollouts itself is NOT installed (the cache is shared by every checkout): run it with PYTHONPATH=<checkout>.
# The ready marker records a hash of what was installed; a checkout whose list differs gets it installed again.
#
# Exit status 0 and the venv's python printed on the last line when ready; otherwise non-zero, and the reason is
# written to <venv>.unavailable, which tests/test_verifiers.py prints when it skips.
#   --check                        build nothing: print the venv's python if it is ready, else the reason, exit 1
#   HF_ROLLOUTS_SKIP_VERIFIERS=1   do not build (the tests skip, saying so)
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=1 # bump when the recipe below changes
VENV="${HF_ROLLOUTS_VERIFIERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hf_rollouts/verifiers-venv-r$RECIPE}"
LABEL=verifiers SKIP_VAR=HF_ROLLOUTS_SKIP_VERIFIERS SCRIPT=scripts/setup_verifiers.sh
source scripts/cached_venv.sh "$@"

# The project's dependencies (torch as the local CPU wheel), its verifiers extra, and pytest.
REQS="$("$PYTHON" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
deps = [d for d in project["dependencies"] if not d.replace(" ", "").startswith("torch")]
print("\n".join(["torch==2.13.0", *deps, *project["optional-dependencies"]["verifiers"], "pytest>=8"]))
')"
STAMP="recipe $RECIPE reqs $(printf '%s' "$REQS" | sha256sum | cut -c1-16)"

exec 9>"$VENV.lock" # one builder at a time: several checkouts share the cache
flock 9
if [ -f "$READY" ] && [ "$(cat "$READY")" = "$STAMP" ] && "$VENV/bin/python" -c "import verifiers, torch" 2>/dev/null; then
    rm -f "$UNAVAILABLE"
    echo "$VENV/bin/python"
    exit 0
fi

started=$(date +%s)
rm -f "$UNAVAILABLE" "$READY"
echo "Building the verifiers venv at $VENV (log: $LOG) ..." >&2
{
    { [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"; } &&
        "$VENV/bin/python" -m pip install -q --retries 2 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0" &&
        printf '%s\n' "$REQS" | xargs -d '\n' "$VENV/bin/python" -m pip install -q --retries 2 &&
        "$VENV/bin/python" -c "import verifiers, mcp, torch, transformers
from importlib.metadata import version
print('verifiers', version('verifiers'), 'mcp', version('mcp'), 'transformers', transformers.__version__)"
} >"$LOG" 2>&1 || {
    tail -n 5 "$LOG" >&2 || true
    unavailable "installing the verifiers extra failed (see $LOG: $(grep -m1 -E 'ERROR|Error' "$LOG" | cut -c1-200))"
}
echo "$STAMP" >"$READY"
echo "verifiers venv ready in $(($(date +%s) - started)) s: $(tail -n 1 "$LOG")" >&2
echo "$VENV/bin/python"
