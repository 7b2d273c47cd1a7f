"""Which target KV heads look at the passkey? For passkey prompts (2k tokens, depths 0.25 and 0.5)
records one verification pass at the answer with the profiler's recorder and prints, per KV head,
the share of its history signal that falls on the needle, the heads of a profile, and how many
needle rows the every-head (target-only) ranking keeps at S = 256.

    python probes/passkey_needle_heads.py [profiles/smollm2-draft.json]
"""

import sys
from pathlib import Path

import torch

from dustin_eval.passkey import make_passkey_prompt
from dustin_profile.artifact import load_profile
from dustin_profile.groundtruth import record_window
from dustin_runtime import pipeline


def main(profile: str = "profiles/smollm2-draft.json") -> None:
    heads = [(h.layer, h.kv_head) for h in load_profile(profile).target_heads]
    tgt = pipeline.load("smollm2", dtype=torch.float32, device="cpu")
    drf = pipeline.load("models/smollm2-draft", dtype=torch.float32, device="cpu")
    filler = "\n".join(p.read_text() for p in sorted(Path("../shared/corpus/gutenberg/eval").glob("*.txt"))[:3])
    G = tgt.model.cfg.num_kv_heads
    for depth in (0.25, 0.5):
        pr = make_passkey_prompt(tgt.tokenizer, filler, 2048, depth, 43625 + int(depth * 100), seed=7)
        answer = tgt.tokenizer.encode(" " + pr.answer, add_special_tokens=False)
        L = len(pr.ids)
        rec = record_window(tgt.model, drf.model, pr.ids + (answer + [13] * 8)[:5], [L], gamma=4, verify_tokens="text")
        attn = rec["attn"][0, :L]  # [L]: the target's true verification attention
        ns, ne = pr.needle_start, pr.needle_start + pr.needle_len
        print(f"depth {depth}: needle rows [{ns}, {ne}); true attention mass on the needle {attn[ns:ne].sum():.3f}")
        sig = rec["target"][:, 0, :L]  # [Ct, L]: history signal of every target KV head
        share = sig[:, ns:ne].sum(1) / sig.sum(1).clamp_min(1e-9)
        top = torch.argsort(share, descending=True)[:10]
        print("  heads with the largest needle share:", [(f"L{int(c) // G}.{int(c) % G}", round(float(share[c]), 3))
                                                        for c in top])
        print("  the profile's heads:", [(f"L{layer}.{g}", round(float(share[layer * G + g]), 4)) for layer, g in heads])
        total = (sig / sig.sum(1, keepdim=True)).sum(0)
        picked = torch.argsort(total[4:L - 64], descending=True)[:188] + 4
        print("  every-head ranking keeps", int(((picked >= ns) & (picked < ne)).sum()), "of", ne - ns, "needle rows")


if __name__ == "__main__":
    main(*sys.argv[1:])
