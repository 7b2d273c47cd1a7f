"""Retrieval-head grouping: query heads of one KV head are scored as one head with stacked queries
(keys read once), which must equal scoring them one by one."""

import pytest
import torch

from dustin_runtime.ops import SparseOps
from dustin_runtime.sparse.signals import layer_heads, score_heads


def test_layer_heads_group_by_kv_head():
    heads = ((3, 1, (2, 3)), (3, 0, (0, 1)), (5, 2, (4,)), (5, 0, (0, 1)))
    lh = layer_heads(heads, "cpu")
    assert list(lh) == [3, 5]
    assert lh[3].query.tolist() == [2, 3, 0, 1] and lh[3].kv.tolist() == [1, 1, 0, 0]
    assert lh[3].groups.tolist() == [1, 0]
    assert lh[5].groups is None  # 1 and 2 query heads: unequal groups, scored head by head


@pytest.mark.parametrize("reduce", ["sum", "max"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_grouped_scoring_equals_per_head(reduce, accumulate):
    g = torch.Generator().manual_seed(0)
    B, H, G, M, D, N = 2, 8, 4, 3, 16, 37
    q = torch.randn(B, H, M, D, generator=g)
    k = torch.randn(B, G, N, D, generator=g)
    lens = torch.tensor([37, 20], dtype=torch.int32)
    lh = layer_heads(((0, 2, (4, 5)), (0, 1, (2, 3))), "cpu")[0]
    qs = q.index_select(1, lh.query)
    base = torch.rand(B, N, generator=g)
    got, want = base.clone(), base.clone()
    score_heads(SparseOps(triton=True), qs, lh, k, lens, got, reduce, accumulate)  # grouped, kernel
    SparseOps(triton=False).srh_scores(qs, lh.kv, k, lens, want, reduce=reduce, accumulate=accumulate)  # per head
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
