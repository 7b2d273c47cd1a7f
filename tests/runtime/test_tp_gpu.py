"""The tensor-parallel code path on one GPU: world size 1 under NCCL (joined as torchrun would start
it), every phase captured as a CUDA graph with its collectives inside, the same tokens as the
same weights without a process group."""

import os
import socket

import pytest
import torch

from dustin_runtime.generate import generate
from dustin_runtime.loader import load_model
from dustin_runtime.sampling import SamplingConfig
from dustin_runtime.sparse.config import SparseConfig
from dustin_runtime.sparse.policies import make_policy
from dustin_runtime.speculative import speculative_generate

pytestmark = pytest.mark.gpu

SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=132)


@pytest.fixture(scope="module")
def world1():
    """This process as rank 0 of 1 under NCCL, through `dustin_runtime.tp.start`."""
    from dustin_runtime import tp as tensor_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    group = tensor_parallel.start(1, "cuda")
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    yield group
    tensor_parallel.finish()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def models(world1, tmp_path_factory, make_tiny_hf):
    root = tmp_path_factory.mktemp("tp-gpu")
    make_tiny_hf("qwen3", root / "t", 91, **SHAPE)
    make_tiny_hf("qwen3", root / "d", 92, num_hidden_layers=1, **SHAPE)
    out = {}
    for name, tp in (("plain", None), ("tp", world1)):
        t, _ = load_model(str(root / "t"), dtype=torch.bfloat16, device="cuda", tp=tp)
        d, _ = load_model(str(root / "d"), dtype=torch.bfloat16, device="cuda")
        out[name] = (t.use_kernels(), d.use_kernels())
    return out


def prompts(batch, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 132, (n,), generator=g).tolist() for n in torch.randint(3, 400, (batch,), generator=g).tolist()]


def policy(name, t, d):
    cfg = SparseConfig(budget=64, sinks=4, window=16, m=16, draft_heads=((0, 1, (2, 3)),),
                       target_heads=((0, 0, (0, 1)), (1, 1, (2, 3))))
    return make_policy(name, None if name == "full" else cfg, target=t, draft=d)


@pytest.mark.parametrize("name", ["full", "dustin", "quest"])
def test_world_size_1_graphs_equal_no_process_group(models, name):
    for call in range(2):  # the second call replays the graphs
        ps = prompts(8, seed=call)
        out = {}
        for mode, (t, d) in models.items():
            res = speculative_generate(t, d, ps, 20, gamma=4, hooks=policy(name, t, d))
            assert res.stats.cuda_graphs
            out[mode] = res
        assert out["tp"].tokens == out["plain"].tokens and out["tp"].stats.accepted == out["plain"].stats.accepted
    from dustin_runtime.engine import default_engine

    t, d = models["tp"]
    assert default_engine(t, d).last.graphs.captured


def test_world_size_1_autoregressive_and_sampling(models):
    ps = prompts(5, seed=7)
    (t, d), (pt, _) = models["tp"], models["plain"]
    assert generate(t, ps, 12).tokens == generate(pt, ps, 12).tokens
    s = SamplingConfig(temperature=0.9)
    res = speculative_generate(t, d, ps, 12, gamma=3, sampling=s, seed=1)
    assert res.stats.cuda_graphs and all(len(x) == 12 for x in res.tokens)


def test_bench_e2e_under_world_size_1(world1, tmp_path):
    """`dustin bench e2e --tp 1` under a launcher: graph phases with their collectives, and each
    phase's collectives timed alone."""
    from dustin_eval.bench_e2e import E2EConfig, run_e2e, write_result

    cfg = E2EConfig(target="qwen2.5-0.5b", batch=4, context=2048, new_tokens=16, budget=256, m=64, alphas=(),
                    phase_reps=5, policies=("ar", "full", "dustin"))
    res = run_e2e(cfg, "pytest", tp=world1)
    assert write_result(res, tmp_path).name == "e2e-qwen2.5-0.5b-2048-4.json"
    assert res["tp"]["world"] == 1 and res["tp"]["nccl_nvls_enable"] == "0"
    for r in res["records"]:
        assert r["cuda_graphs"] and r["graph_phase_sum_ms"] > 0
        phases = r["tp"]["phases"]
        target = "decode" if r["policy"] == "ar" else "verify"
        assert phases[target]["calls"] == 1 + 2 * 24 and r["tp"]["collective_ms_per_step"] >= 0


def test_refresh_search_under_nccl_equals_no_process_group(world1, models):
    """`dustin profile --max-refresh` under --tp: the refresh search's teacher-forced passes with rank
    0's NLLs shared over NCCL (`TensorParallel.share`) choose what they choose without a group."""
    from types import SimpleNamespace

    from dustin_profile.run import _refresh_layers

    assert world1.share({"nll": [1.5, 2.25]}) == {"nll": [1.5, 2.25]}
    g = torch.Generator().manual_seed(7)
    wins = [SimpleNamespace(tokens=torch.randint(0, 132, (600,), generator=g).tolist()) for _ in range(4)]
    cfg = SimpleNamespace(gamma=4, prefill_chunk=2048, max_refresh=2)
    sparse = policy("dustin", *models["plain"]).cfg
    out = {mode: _refresh_layers(sparse, cfg, t, d, wins[:2], wins[2:], world1 if mode == "tp" else None)
           for mode, (t, d) in models.items()}
    (layers, rec), (tp_layers, tp_rec) = out["plain"], out["tp"]
    assert tp_layers == layers and tp_rec["stop"] == rec["stop"] and len(tp_rec["rounds"]) == len(rec["rounds"])
    for k in ("ppl_ratio", "ppl_ratio_without"):
        assert tp_rec[k] == pytest.approx(rec[k], rel=1e-3), k
    assert tp_rec["heldout"]["dustin"] == pytest.approx(rec["heldout"]["dustin"], rel=1e-3)
