"""Probe: the draft's forwards over the set as one persistent CUDA kernel (`Transformer.whole`,
`dustin_kernels.draft_forward`) against the layer-by-layer Triton path, end to end in `dustin bench
e2e`'s loop (random weights at the preset shapes, one process), interleaved rounds. Arms: `layers`
(the kernel off), `whole` (on; 16 SMs left to the side stream's history scoring while drafting),
`whole-r0` (on, every SM). Runs against b3ecc3d, the last commit where the runtime routes draft
forwards to the kernel (removed after: measured slower, kernels/NOTES.md).

    python probes/probe_whole_draft.py [policies] [batch] [context] [rounds] [arms]
      -> $OUT/probe-whole-draft.json"""

from __future__ import annotations

import sys

from common import e2e_arms

from dustin_runtime.model import Transformer
from dustin_runtime.sparse import policies as pol

WHOLE_SET = Transformer._whole_set
FORWARD_SET = pol._DraftBackend.forward_set


def arm(name: str) -> None:
    Transformer._whole_set = WHOLE_SET if name != "layers" else (lambda self, backend, ctx, B, T: None)
    if name == "whole-r0":
        def forward_set(self, ctx):
            r = FORWARD_SET(self, ctx)
            return None if r is None else (r[0], 0)
        pol._DraftBackend.forward_set = forward_set
    else:
        pol._DraftBackend.forward_set = FORWARD_SET


def main(policies: str = "dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2",
         arms: str = "layers,whole,whole-r0") -> None:
    e2e_arms(policies, batch, context, rounds, arms.split(","), arm, "whole", "probe-whole-draft.json")

if __name__ == "__main__":
    main(*sys.argv[1:])
