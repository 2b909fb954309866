# Sourced by scripts/setup_vllm.sh and scripts/setup_verifiers.sh: what their cached venvs share. Before sourcing,
# set LABEL (what the messages call the venv), VENV (its path), SKIP_VAR (the name of the variable that skips the
# build when set to 1) and SCRIPT (the setup script, for messages); pass the script's first argument.
# Sets PYTHON, READY (the ready marker), UNAVAILABLE (the reason file the tests print when they skip) and LOG, and
# defines unavailable REASON...; handles SKIP_VAR=1 and --check (print the venv's python if ready, else the reason).
PYTHON="${PYTHON:-python3}"
READY="$VENV/.hf_rollouts_ready"
UNAVAILABLE="$VENV.unavailable"
LOG="$VENV.log"
mkdir -p "$(dirname "$VENV")"

unavailable() { # reason...
    echo "$LABEL venv unavailable: $*" >&2
    printf '%s\n' "$*" >"$UNAVAILABLE"
    exit 1
}

if [ "${!SKIP_VAR:-0}" = "1" ]; then
    echo "$LABEL venv unavailable: $SKIP_VAR=1 is set (unset it and run bash $SCRIPT)" >&2
    exit 1
fi
if [ "${1:-}" = "--check" ]; then
    if [ -f "$READY" ] && [ -x "$VENV/bin/python" ]; then
        echo "$VENV/bin/python"
        exit 0
    fi
    if [ -f "$UNAVAILABLE" ]; then
        echo "$LABEL venv unavailable: $(cat "$UNAVAILABLE")" >&2
    else
        echo "$LABEL venv not built at $VENV: run bash $SCRIPT (bash scripts/test.sh runs it)" >&2
    fi
    exit 1
fi
