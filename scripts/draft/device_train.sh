#!/usr/bin/env bash
# Draft training on the GPU machine (device tool, call 3 of 3; see results/draft/README.md).
# Reassembles the SmolLM2 GGUF from the two halves carried by calls 1 and 2 and distils from it;
# if a half is missing (the machine was given back between calls) it trains with CE only.
# Usage: bash scripts/draft/device_train.sh TRAIN_SECONDS [extra train.py args]
set -u
TRAIN_S=${1:-270}
shift || true
source scripts/device_env.sh
export TQDM_DISABLE=1
OUTD=${OUT:-runs/draft}
mkdir -p "$OUTD"
if ls .whl/gguf-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/gguf-*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GG=/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
TEACHER=()
if [ -f .carry/g1/part ] && [ -f .carry/g2/part ] && python3 -c "import gguf" 2>/dev/null; then
  mkdir -p /tmp/gguf && cat .carry/g1/part .carry/g2/part > "$GG"
  if echo "$SHA  $GG" | sha256sum -c --quiet; then TEACHER=(--teacher-gguf "$GG"); else echo "GGUF sha256 mismatch: CE only"; fi
else
  echo "GGUF halves or gguf wheel missing (machine given back between calls?): training CE only"
fi
ls -la .carry/*/
cd scripts/draft && python3 train.py --data '../../.carry/d*/train.bin' --eval-bin ../../.carry/d3/eval.bin \
  --time-budget "$TRAIN_S" "${TEACHER[@]}" --out "$OUTD" "$@" 2>&1 | tee "$OUTD/stdout.log"
