"""Triton kernels and their pure-torch references (installed as `dustin_kernels`).

- `full_verify_attention`: split-KV attention of M verification queries over the whole cache.
- `sparse_verify_attention`: the same over a selected index set per sequence (or per KV head);
  `sparse_verify_attention_rope` takes the fused qkv projection instead (RoPE and the cache write inside).
- `srh_scores`: softmax mass of retrieval-head queries per context position, [B, N_max].
- `select_indices`: sinks + window + top-m by one score + fill by another, sorted, exact size.
- `lookup_draft`: a draft token copied from a sequence's history (longest, most recent n-gram
  match; a copy in progress goes on), else the draft model's; written to the history and counted.

Each has a `<name>_ref` pure-torch reference (fp32 math). Launchers refuse bad arguments with
`KernelArgumentError` (a ValueError). The package imports torch and triton only.
"""

from dustin_kernels._util import KernelArgumentError
from dustin_kernels.lookup import lookup_draft
from dustin_kernels.reference import (
    full_verify_attention_ref,
    lookup_draft_ref,
    select_indices_ref,
    sparse_verify_attention_ref,
    sparse_verify_attention_rope_ref,
    srh_scores_ref,
)
from dustin_kernels.select import select_indices
from dustin_kernels.srh_scores import srh_scores
from dustin_kernels.verify_attention import (
    full_verify_attention,
    sparse_verify_attention,
    sparse_verify_attention_rope,
)

__all__ = [
    "KernelArgumentError",
    "full_verify_attention",
    "full_verify_attention_ref",
    "sparse_verify_attention",
    "sparse_verify_attention_ref",
    "sparse_verify_attention_rope",
    "sparse_verify_attention_rope_ref",
    "srh_scores",
    "srh_scores_ref",
    "select_indices",
    "select_indices_ref",
    "lookup_draft",
    "lookup_draft_ref",
]
