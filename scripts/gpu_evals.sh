#!/usr/bin/env bash
# The SmolLM2 pair's evaluations with statistical power, on a GPU (the CPU takes hours):
# PG-19-style perplexity over 16 windows x 1024 scored tokens and paired acceptance over
# 8 windows x 256 new tokens, at 4k and 8k, S = 512, with the profile, with sparse drafting, and with the single-set profile's refresh layers (`dustin profile
# --max-refresh`; the other P1 steps pass --refresh-layers none; REFRESH=8,20 gives a list by hand, REFRESH=none turns them off). Usage: `make repro-evals-gpu`
# (or TARGET=<file.gguf> BOOKS=<eval books folder> bash scripts/gpu_evals.sh where the `smollm2`
# package is missing). Env overrides: DRAFT (the draft checkpoint), P1 (the profile), ONLY (space-separated step names, e.g. ONLY="pg19-refresh acceptance-refresh";
# default: every step). Steps: pg19 acceptance acceptance-verify-set
# pg19-refresh acceptance-refresh pg19-refresh-budgets acceptance-refresh-768 (the profile's refresh layers
# at S = 768 and 1024) acceptance-draft-paired (sparse drafting against full-KV drafting on the same steps:
# every eval book, 24 windows, into $ACP; not part of the default run) acceptance-lookup (the draft
# with context lookup, --draft-lookup 4:2, and 4:1 under full verification alone; 24 windows, into $ACP;
# not part of the default run) acceptance-draft-paired-books (the same comparison on 72 windows, the
# first 3 of every eval book, intervals resampling books; into $ACB; not part of the default run).
set -u
PY=${PY:-python3}
TARGET=${TARGET:-smollm2}
DRAFT=${DRAFT:-models/smollm2-draft}
BOOKS=${BOOKS:-../shared/corpus/gutenberg/eval}
DTYPE=${DTYPE:-fp32}
P1=${P1:-profiles/smollm2-draft.json}
ONLY=${ONLY:-}
REFRESH=${REFRESH:-}  # empty: the profile's refresh layers
refresh=${REFRESH:+--refresh-layers $REFRESH}
PGO=${PGO:-results/fidelity-pg19-policies}  # output folders (overridable: a device run writes under $OUT)
PGR=${PGR:-results/fidelity-pg19}  # dustin with the profile's refresh layers (and, under budgets/, at S = 768, 1024)
ACO=${ACO:-results/acceptance-retention}
ACP=${ACP:-results/acceptance-lookup}
ACB=${ACB:-results/acceptance-sparse-drafting}
ACX=${ACX:-results/acceptance-exact}
STEPS="pg19 acceptance acceptance-verify-set pg19-refresh acceptance-refresh pg19-refresh-budgets acceptance-refresh-768 acceptance-draft-paired acceptance-lookup acceptance-draft-paired-books acceptance-exact"
for s in $ONLY; do
  case " $STEPS " in *" $s "*) ;; *) echo "gpu_evals.sh: ONLY: unknown step '$s'; steps: $STEPS" >&2; exit 2;; esac
done
common="--target $TARGET --draft $DRAFT --dtype $DTYPE"  # the device: CUDA when available
status=0
run() { echo "+ $*"; "$@" || { echo "FAILED: $*"; status=1; }; }
want() { [ -z "$ONLY" ] || case " $ONLY " in *" $1 "*) true;; *) false;; esac; }
want_only() { case " $ONLY " in *" $1 "*) true;; *) false;; esac; }  # steps run only when named
step() { local name=$1; shift; if want "$name"; then echo "== $name"; run "$@"; fi; }
for ctx in 4096 7168; do  # 7168 + 1024 = the models' 8192 positions
  step pg19 $PY -m dustin.cli eval pg19 $common --data "$BOOKS" --context $ctx --eval-tokens 1024 --windows 16 \
    --policy full,dustin,streamingllm,quest,oracle --budget 512 --profile $P1 --refresh-layers none \
    --out-dir $PGO
done
step acceptance $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 --windows 8 \
  --max-new-tokens 256 --budget 512 --policy full,dustin,streamingllm,quest,oracle --profile $P1 --refresh-layers none \
  --out $ACO/smollm2-draft
step acceptance-verify-set $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 \
  --windows 8 --max-new-tokens 256 --budget 512 --policy dustin,streamingllm --draft-kv verify-set \
  --profile $P1 --refresh-layers none --out $ACO/smollm2-draft-verify-set
for ctx in 4096 7168; do  # dustin without refresh: the pg19 step's records (same windows)
  step pg19-refresh $PY -m dustin.cli eval pg19 $common --data "$BOOKS" --context $ctx --eval-tokens 1024 \
    --windows 16 --policy full,dustin --budget 512 --profile $P1 $refresh \
    --out-dir $PGR
done
step acceptance-refresh $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 \
  --windows 8 --max-new-tokens 256 --budget 512 --policy full,dustin $refresh --profile $P1 \
  --out $ACO/smollm2-draft-refresh
for ctx in 4096 7168; do  # dustin with the profile's refresh layers at larger budgets
  step pg19-refresh-budgets $PY -m dustin.cli eval pg19 $common --data "$BOOKS" --context $ctx --eval-tokens 1024 \
    --windows 16 --policy full,dustin --budget 768,1024 --profile $P1 $refresh \
    --out-dir $PGR/budgets
done
step acceptance-refresh-768 $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 \
  --windows 8 --max-new-tokens 256 --budget 768 --policy full,dustin $refresh --profile $P1 \
  --out $ACO/smollm2-draft-refresh-768
if want_only acceptance-draft-paired; then  # each step drafted twice (set and whole cache), both verified in full
  echo "== acceptance-draft-paired"
  run $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 --windows 24 \
    --max-new-tokens 256 --budget 512 --policy dustin --draft-kv verify-set --profile $P1 $refresh \
    --out $ACP/smollm2-draft-verify-set
fi
if want_only acceptance-draft-paired-books; then  # 3 windows of every eval book; intervals resample books
  echo "== acceptance-draft-paired-books"
  run $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 --windows 72 \
    --windows-per-book 3 --max-new-tokens 256 --budget 512 --policy dustin --draft-kv verify-set --profile $P1 \
    $refresh --out $ACB/smollm2-draft-verify-set
fi
if want_only acceptance-lookup; then
  echo "== acceptance-lookup"
  lk="$common --data $BOOKS --contexts 4096,7936 --windows 24 --max-new-tokens 256 --budget 512 --profile $P1"
  run $PY -m dustin.cli eval acceptance $lk $refresh --policy full,dustin --draft-kv verify-set --draft-lookup 4:2 \
    --out $ACP/smollm2-draft-lookup4-2
  run $PY -m dustin.cli eval acceptance $lk --policy full --draft-lookup 4:1 --no-paired --no-arr \
    --out $ACP/smollm2-draft-lookup4-1
fi
if want_only acceptance-exact; then  # exact mode: its output (prefix vs full = 1) and the agreement bench e2e replays
  echo "== acceptance-exact"
  run $PY -m dustin.cli eval acceptance $common --data "$BOOKS" --contexts 4096,7936 --windows 16 \
    --max-new-tokens 256 --budget 512,1024,2048,4096 --policy ar,full,dustin,dustin-x --draft-kv verify-set \
    --profile $P1 $refresh --no-paired --no-arr --out $ACX/smollm2-draft-verify-set
fi
exit $status
