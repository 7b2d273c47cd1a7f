"""Probe: sparse drafting with RoPE and the cache write inside the draft's attention kernel
(`sparse_verify_attention_rope`) against the separate RoPE kernel, end to end in `dustin bench e2e`'s
loop (random weights at the preset shapes, one process, interleaved rounds): ms per step and phases.

    python probes/probe_fused_rope.py [policies] [batch] [context] [rounds]  -> $OUT/probe-fused-rope.json"""

from __future__ import annotations

import sys

from common import e2e_ab

from dustin_runtime.sparse import policies

FUSED = policies._DraftBackend.attend_qkv


def arm(on: bool) -> None:
    policies._DraftBackend.attend_qkv = FUSED if on else (lambda self, *a: None)  # None: the separate RoPE kernel


def main(names: str = "dustin-vs,streamingllm-vs", batch: str = "16", context: str = "32768", rounds: str = "2"):
    e2e_ab(names, batch, context, rounds, arm, "fused_rope", "probe-fused-rope.json")


if __name__ == "__main__":
    main(*sys.argv[1:])
