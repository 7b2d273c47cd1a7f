#!/usr/bin/env bash
# Draft training on the GPU machine through the device tool, whose calls carry at most 64 MiB each:
#   call 1: bash scripts/draft/device_train.sh stash   (carrying .carry/h1 = the GGUF's first half, .carry/d1)
#   call 2: bash scripts/draft/device_train.sh stash   (carrying .carry/h2 = the second half, .carry/d2)
#   call 3: bash scripts/draft/device_train.sh TRAIN_SECONDS [train.py args]  (carrying .carry/d3, .carry/tok, .whl)
# `stash` copies whatever .carry/ parts came with the call to /tmp/carry (kept while the machine stays
# warm); the training call reassembles the GGUF (sha256 checked), distils from it into $OUT/run
# (weights in parts of 15 MiB, config, log, metrics) and exports the folder to /tmp/newdraft.
# Make the parts with `make draft-parts`.
set -u
STASH=/tmp/carry
if [ "${1:-}" = stash ]; then
  mkdir -p $STASH && cp -r .carry/* $STASH/ && du -sh $STASH/* && exit 0
fi
TRAIN_S=${1:-270}
shift || true
source scripts/device_env.sh
export TQDM_DISABLE=1
DEST=$(mkdir -p "${OUT:-runs}" && cd "${OUT:-runs}" && pwd)
OUTD=$DEST/run
mkdir -p "$OUTD"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/gguf-*.whl \
  && export PYTHONPATH="$PYTHONPATH:/tmp/site"
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GG=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p /tmp/gguf && cat $STASH/h1/part $STASH/h2/part > "$GG"
echo "$SHA  $GG" | sha256sum -c --quiet || { echo "GGUF sha256 mismatch"; exit 1; }
cp -r .carry/d3 $STASH/ 2>/dev/null
ls -la $STASH/*/
(cd scripts/draft && python3 train.py --data "$STASH/d*/train.bin" --eval-bin $STASH/d3/eval.bin \
  --time-budget "$TRAIN_S" --teacher-gguf "$GG" --out "$OUTD" "$@" 2>&1 | tee "$OUTD/stdout.log") || exit 1
# the folder for the calls that follow while the machine stays warm ($OUT brings back files of
# 16 MiB at most: the run's weight parts come back and export.py runs again at home)
(cd scripts/draft && DUSTIN_TOKENIZER_FROM=$PWD/../../.carry/tok python3 export.py --run "$OUTD" --model /tmp/newdraft --results /tmp/newdraft-results) || exit 1
