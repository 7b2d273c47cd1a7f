"""The engine's BLAS setting on CPU: nothing is switched (CPU torch has no cuBLASLt: setting it raises)."""

import torch

from dustin_runtime.engine import Engine, PhaseGraphs, blas_library


def test_blas_library_none_leaves_torch_alone():
    before = torch.backends.cuda.preferred_blas_library()
    with blas_library(None):
        assert torch.backends.cuda.preferred_blas_library() == before
    assert torch.backends.cuda.preferred_blas_library() == before


def test_cpu_loop_states_switch_no_blas_library(tiny_hf):
    from dustin_runtime.loader import load_model

    path, _ = tiny_hf("llama3", seed=3)
    model, _ = load_model(str(path), dtype=torch.float32, device="cpu")
    st = Engine(model, graphs=True).state(None, lambda s: None, graphs=True, sampled=False)
    assert st.graphs.blas is None and not st.graphs.enabled
    calls = []
    PhaseGraphs(False).run("p", lambda: calls.append(1))
    assert calls == [1]
