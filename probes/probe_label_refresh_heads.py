"""Label keys and refresh-layer KV heads together: does the perplexity cost of scoring 16 of 64 key
channels (`--score-channels 16`, results/pg19-16x1024/channels) add to that of refresh layers scoring
half their KV head-layers (L5: KV 0, L17: KV 0, 1; probes/probe_refresh_heads.py)? Their costs
multiply: at the 72B shape the cost model puts the two together near 1.35% of 80 full layers against
3.72% today. The committed profile (S = 512, refresh 5 and 17), teacher-forced on the CPU, the runtime's
label keys (channels chosen by `dustin_profile.channels` on 4 calibration windows).

    python probes/probe_label_refresh_heads.py OUT.json [windows] [context] [eval_tokens] [split]
    (defaults: 16 4096 256 eval)
"""

from __future__ import annotations

import sys
from dataclasses import replace

import torch
from common import report_set_ppl, smollm2_windows
from probe_refresh_heads import with_heads

from dustin_eval.corpus import gutenberg_split
from dustin_eval.pg19 import iter_windows
from dustin_profile import channels as chs
from dustin_runtime.loader import resolve_checkpoint
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.tokenizer import load_tokenizer

HEADS = {5: (0,), 17: (0, 1)}
R = 16


def main(out: str, windows: int = 16, context: int = 4096, eval_tokens: int = 256, split: str = "eval") -> None:
    t, d, cfg, wins = smollm2_windows(windows, context, eval_tokens, split, refresh=True)
    tok = load_tokenizer(resolve_checkpoint("smollm2"))
    calib = list(iter_windows(tok, gutenberg_split("calib"), context, max_windows=4, max_windows_per_book=1))
    table = chs.choose(chs.channel_stats(t, [w.ids for w in calib], context), R)
    labelled = replace(cfg, score_channels=table)
    runs = [("full", None),
            ("dustin, refresh 5, 17, whole keys", make_policy("dustin", cfg, target=t, draft=d)),
            (f"dustin, {R} of 64 channels", make_policy("dustin", labelled, target=t, draft=d)),
            ("dustin, refresh heads L5: KV 0, L17: KV 0.1", with_heads(make_policy("dustin", cfg, target=t, draft=d),
                                                                        HEADS)),
            (f"dustin, {R} channels + refresh heads", with_heads(make_policy("dustin", labelled, target=t, draft=d),
                                                                  HEADS))]
    torch.manual_seed(0)
    report_set_ppl(out, t, d, wins, context, runs, eval_tokens=eval_tokens, budget=cfg.budget, split=split,
                   refresh_layers=list(cfg.refresh_layers), heads={str(k): v for k, v in HEADS.items()}, r=R,
                   calib_books=[w.book for w in calib])


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], *(int(x) for x in a[1:4]), *a[4:5])
