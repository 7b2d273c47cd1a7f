#!/usr/bin/env bash
# The SmolLM2 pair's evaluations with statistical power, on a GPU (the CPU takes hours):
# PG-19-style perplexity over 16 windows x 1024 scored tokens and paired acceptance over
# 8 windows x 256 new tokens, at 4k and 8k, S = 512, with the single-set and the layer-group
# profiles and with sparse drafting. Usage: `make repro-evals-gpu` (or TARGET=<file.gguf>
# BOOKS=<eval books folder> bash scripts/gpu_evals.sh where the `smollm2` package is missing).
set -u
PY=${PY:-python3}
TARGET=${TARGET:-smollm2}
BOOKS=${BOOKS:-../shared/corpus/gutenberg/eval}
DTYPE=${DTYPE:-fp32}
P1=profiles/smollm2-draft.json
PG=profiles/smollm2-draft-groups.json
PGO=results/pg19-16x1024
ACO=results/acceptance-8x256
common="--target $TARGET --draft models/smollm2-draft --dtype $DTYPE --device cuda"
status=0
run() { echo "+ $*"; "$@" || { echo "FAILED: $*"; status=1; }; }
for ctx in 4096 7168; do  # 7168 + 1024 = the models' 8192 positions
  run $PY -m dustin.cli eval pg19 $common --data "$BOOKS" --context $ctx --eval-tokens 1024 --windows 16 \
    --batch-size 16 --policy full,dustin,streamingllm,quest,oracle --budget 512 --profile $P1 --out-dir $PGO
done
run $PY -m dustin.cli eval acceptance $common --books-dir "$BOOKS" --contexts 4096,8192 --windows 8 \
  --max-new-tokens 256 --budgets 512 --policies full,dustin,streamingllm,quest,oracle --profile $P1 \
  --out-dir $ACO --name smollm2-draft
for ctx in 4096 7168; do
  run $PY -m dustin.cli eval pg19 $common --data "$BOOKS" --context $ctx --eval-tokens 1024 --windows 16 \
    --batch-size 16 --policy full,dustin --budget 512 --profile $PG --out-dir $PGO/groups
done
run $PY -m dustin.cli eval acceptance $common --books-dir "$BOOKS" --contexts 4096,8192 --windows 8 \
  --max-new-tokens 256 --budgets 512 --policies full,dustin --profile $PG --out-dir $ACO --name smollm2-draft-groups
run $PY -m dustin.cli eval acceptance $common --books-dir "$BOOKS" --contexts 4096,8192 --windows 8 \
  --max-new-tokens 256 --budgets 512 --policies dustin,streamingllm --draft-kv verify-set --profile $P1 \
  --out-dir $ACO --name smollm2-draft-verify-set
exit $status
