#!/usr/bin/env bash
# The main job on the embedded tiny model: set up, generate Twenty Questions rollouts, print a summary and one trajectory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1
OUT="${OUT:-outputs/demo}"
.venv/bin/hf-rollouts generate --env twenty_questions --num-tasks 8 --env-config '{"max_turns": 6}' \
  --num-rollouts 4 --model tiny --seed 0 --output "$OUT" --overwrite
.venv/bin/hf-rollouts inspect "$OUT" --row 0 --rollout 0
