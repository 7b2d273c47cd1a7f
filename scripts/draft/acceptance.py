"""Greedy speculative acceptance of the SmolLM2 draft against SmolLM2-135M through dustin_runtime.

For each context length, one batch of prompts: `ctx` tokens of each eval book taken from a fixed
offset (past the Gutenberg front matter), then `--new` tokens decoded with full verification,
gamma 4, greedy. Reports mean accepted draft tokens per step (bonus excluded) per context and per
book, and tokens per step (+1). `--check-greedy` also decodes the first prompt of the first context
autoregressively and checks the speculative tokens equal it (greedy decoding is lossless). Usage:
  python scripts/draft/acceptance.py --draft models/smollm2-draft --contexts 2048 4096 8064 \
      --books 4 --out results/draft-training/acceptance
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch
from common import load_tokenizer

EVAL = "eval"


def book_prompts(corpus: str, n_books: int, offset: int, ctx: int, tok) -> tuple[list[str], list[list[int]]]:
    """`ctx` tokens from `offset` of the first `n_books` eval books (sorted) long enough for it."""
    folder = os.path.join(corpus, EVAL)
    names, prompts = [], []
    for f in sorted(os.listdir(folder)):
        if len(names) == n_books:
            break
        ids = tok(open(os.path.join(folder, f), encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
        if len(ids) >= offset + ctx:
            names.append(f)
            prompts.append(ids[offset:offset + ctx])
    return names, prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", default="models/smollm2-draft")
    ap.add_argument("--corpus", default="../shared/corpus/gutenberg")
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8064])
    ap.add_argument("--books", type=int, default=4)
    ap.add_argument("--offset", type=int, default=10000)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--check-greedy", action="store_true")
    ap.add_argument("--out", default="results/draft-training/acceptance")
    args = ap.parse_args()

    from dustin_runtime import pipeline
    from dustin_runtime.generate import generate
    from dustin_runtime.io.provenance import git_commit
    from dustin_runtime.sampling import SamplingConfig
    from dustin_runtime.speculative import speculative_generate
    from dustin_runtime.tokenizer import eos_ids

    torch.manual_seed(0)
    dtype = pipeline.pick_dtype(args.dtype, args.device)
    t0 = time.time()
    tgt, drf = pipeline.load_pair(args.target, args.draft, dtype=dtype, device=args.device)
    print(f"loaded target {tgt.model_id} and draft {drf.model_id} in {time.time() - t0:.1f}s", flush=True)
    tok = load_tokenizer()
    eos = eos_ids(tgt.tokenizer, tgt.model.cfg.eos_token_ids)
    rows, check = [], None
    for ctx in args.contexts:
        names, prompts = book_prompts(args.corpus, args.books, args.offset, ctx, tok)
        t = time.time()
        res = speculative_generate(tgt.model, drf.model, prompts, args.new, gamma=args.gamma,
                                   sampling=SamplingConfig(), eos_ids=eos)
        s = res.stats
        per_book = s.accepted_per_sequence()
        row = {"context": ctx, "books": names, "batch": len(prompts), "steps": s.steps,
               "new_tokens": s.new_tokens, "mean_accepted_per_step": s.mean_accepted,
               "mean_tokens_per_step": s.mean_accepted + 1, "accepted_per_book": per_book,
               "finish_reasons": res.finish_reasons, "seconds": s.seconds,
               "decode_tokens_per_s": s.tokens_per_s, "wall_s": round(time.time() - t, 1)}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "books"}), flush=True)
        if args.check_greedy and check is None:
            ar = generate(tgt.model, prompts[:1], [args.new], sampling=SamplingConfig(), eos_ids=eos)
            check = {"context": ctx, "book": names[0], "identical": ar.tokens[0] == res.tokens[0],
                     "tokens": len(ar.tokens[0])}
            print("greedy check:", check, flush=True)

    out = {
        "schema_version": 1,
        "command": "python " + " ".join(sys.argv),
        "target": tgt.model_id, "draft": drf.model_id, "device": args.device,
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__, "git_commit": git_commit(),
        "gamma": args.gamma, "sampling": "greedy", "verification": "full", "offset": args.offset,
        "new_tokens": args.new, "results": rows, "greedy_check": check,
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    lines = [
        f"# Draft acceptance through dustin_runtime (greedy, gamma {args.gamma}, full verification)",
        "",
        f"Target `{tgt.model_id}`, draft `{drf.model_id}`, {args.device} {out['dtype']}, "
        f"{len(rows[0]['books'])} Gutenberg eval books, prompt = `context` tokens from token {args.offset} "
        f"of each book, {args.new} new tokens each.",
        "",
        "| context | mean accepted / step | tokens / step | per book | steps | decode tok/s (CPU) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['context']} | {r['mean_accepted_per_step']:.2f} | {r['mean_tokens_per_step']:.2f} | "
                     + " ".join(f"{a:.2f}" for a in r["accepted_per_book"])
                     + f" | {r['steps']} | {r['decode_tokens_per_s']:.1f} |")
    if check:
        lines += ["", f"Greedy check (context {check['context']}, {check['book']}): speculative tokens "
                      f"{'identical to' if check['identical'] else 'DIFFER from'} autoregressive decoding "
                      f"({check['tokens']} tokens)."]
    lines += ["", "Mean accepted / step is over (sequence, step) pairs, bonus token excluded; tokens / step adds it. "
              "Each prompt ends at token offset + context, so each context decodes a different passage of "
              "the same books. Decode tok/s is CPU wall time on a shared machine (prefill excluded): "
              "indicative only.",
              "", "Books: " + ", ".join(rows[0]["books"]), "", "Command:", "", "```", out["command"], "```", ""]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
