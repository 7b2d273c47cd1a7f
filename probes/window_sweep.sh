#!/usr/bin/env bash
# Issue 17 probe: does the recent window (or the signals' aggregation over heads) move dustin's
# perplexity at S = 512, the budget fixed? Chosen on CALIBRATION text, then the choice alone on the
# eval split (never chosen there).
#   1. `dustin eval pg19` on CALIB (16 windows x 1024 scored tokens at 4k) for each variant:
#      --window 16 / 64 (the profile's) / 128 / 256, and aggregation "max" (a copy of the profile);
#   2. the variant with the lowest calibration ratio: pg19 on EVAL at 4k and 7168 (the 16 x 1024
#      windows of results/pg19-16x1024) and paired acceptance at 4k / 8k (8 x 256).
# Usage (GPU, after scripts/device_stage.sh unpack):
#   TARGET=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf CALIB=/tmp/text/calib BOOKS=/tmp/text/eval \
#     OUTD=$OUT/window bash probes/window_sweep.sh
set -u
PY=${PY:-python3}
TARGET=${TARGET:-smollm2}
CALIB=${CALIB:-../shared/corpus/gutenberg/calib}
BOOKS=${BOOKS:-../shared/corpus/gutenberg/eval}
P1=${P1:-profiles/smollm2-draft.json}
OUTD=${OUTD:-/tmp/window}
WINDOWS=${WINDOWS:-16 64 128 256}
N=${N:-16}; TOK=${TOK:-1024}; CTX=${CTX:-4096 7168}; DEVICE=${DEVICE:-cuda}; CALCTX=${CALCTX:-4096}  # (smaller for a CPU smoke run)
common="--target $TARGET --draft models/smollm2-draft --dtype fp32 --device $DEVICE"
mkdir -p "$OUTD"
$PY - "$P1" "$OUTD/profile-max.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
d["aggregation"] = "max"
json.dump(d, open(sys.argv[2], "w"), indent=1)
EOF
variants=()
for w in $WINDOWS; do variants+=("w$w|--profile $P1 --window $w"); done
variants+=("max|--profile $OUTD/profile-max.json")
for v in "${variants[@]}"; do
  name=${v%%|*}; args=${v#*|}
  echo "== calib $name: $args"
  $PY -m dustin.cli eval pg19 $common --data "$CALIB" --context $CALCTX --eval-tokens $TOK --windows $N \
    --batch-size $N --policy full,dustin --budget 512 $args --out-dir "$OUTD/calib-$name" 2>&1 | grep -v "^│\|^┃\|^┏\|^┡\|^└" 
done
best=$($PY - "$OUTD" "$CALCTX" "${variants[@]}" <<'EOF'
import json, sys
out, ctx, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
scores = {}
for v in variants:
    name = v.split("|")[0]
    try:
        rows = json.load(open(f"{out}/calib-{name}/pg19-{ctx}.json"))["rows"]
    except OSError:
        continue
    r = next(r for r in rows if r["policy"] == "dustin")
    scores[name] = r["ppl_ratio"]
    print(f"calib {name}: ratio {r['ppl_ratio']:.4f} [{r['ppl_ratio_lo']:.4f}, {r['ppl_ratio_hi']:.4f}] "
          f"last {r['ppl_ratio_last']:.4f} ARR {r['arr']:.4f}", file=sys.stderr)
print(min(scores, key=scores.get))
EOF
)
echo "chosen on calibration text: $best"
for v in "${variants[@]}"; do [ "${v%%|*}" = "$best" ] && args=${v#*|}; done
for ctx in $CTX; do
  echo "== eval $best context $ctx"
  $PY -m dustin.cli eval pg19 $common --data "$BOOKS" --context $ctx --eval-tokens $TOK --windows $N \
    --batch-size $N --policy full,dustin --budget 512 $args --out-dir "$OUTD/eval-$best" 2>&1 | grep -v "^│\|^┃\|^┏\|^┡\|^└"
done
echo "== acceptance $best"
$PY -m dustin.cli eval acceptance $common --books-dir "$BOOKS" --contexts 4096,8192 --windows $((N < 8 ? N : 8)) \
  --max-new-tokens $((TOK < 256 ? TOK : 256)) --budgets 512 --policies full,dustin $args --out-dir "$OUTD/eval-$best" --name acc
