"""Accuracy checks shared by the kernel tests and the benchmark's correctness gate."""

from __future__ import annotations

import torch

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # relative error vs fp32 reference


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; a NaN (an unwritten, poisoned element) gives inf."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def poisoned(shape, dtype, device) -> torch.Tensor:
    """An output buffer full of NaN, so any element a kernel fails to write fails the check."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def ragged_lens(B: int, lo: int, hi: int, gen: torch.Generator) -> torch.Tensor:
    """B int32 lengths in [lo, hi], the first one equal to hi (a ragged batch for the kernel tests)."""
    lens = torch.randint(lo, hi + 1, (B,), generator=gen)
    lens[0] = hi
    return lens.to(torch.int32)


def kernel_device() -> str:
    """Where the kernel tests run: CUDA when there is a GPU, else the CPU (Triton's interpreter)."""
    return "cuda" if torch.cuda.is_available() else "cpu"
