"""Launcher helpers shared by the kernels: input checks, SM count, self-resetting ticket counters.

`dustin_kernels` is a leaf package: it imports torch and triton only, never the dustin packages."""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

LOG2E = 1.4426950408889634  # log2(e): the kernels' softmax runs in base 2 (exp2 of logits x scale x LOG2E)
_LOCKS: dict[tuple[str, str, int | None], torch.Tensor] = {}  # (name, device type, index) -> counters
_RETIRED: list[torch.Tensor] = []  # grown-out lock buffers stay alive: captured graphs hold their address


class KernelArgumentError(ValueError):
    """A launcher's arguments do not fit its contract (shapes, dtypes, devices, sizes)."""


def next_pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def require(cond: bool, msg: str) -> None:
    """Raise `KernelArgumentError(msg)` unless cond (host-side shape/dtype checks only, never tensor values)."""
    if not cond:
        raise KernelArgumentError(msg)


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device; a small stand-in on CPU (interpreter) runs."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch is usable: a CUDA device of compute capability >= 9 (Hopper),
    not the interpreter, and a Triton with `gdc_wait` and the `launch_pdl` launch option."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9 and _triton_has_pdl()


def ticket_counters(device: torch.device, n: int, name: str = "attention",
                    dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """n counters (int32 unless `dtype`) that are zero between launches (each kernel resets what it used).

    One buffer per (device, name): kernels of one name may share counters since a stream runs them
    one after the other.
    Allocated once per device and grown on demand; growing is not allowed during CUDA graph
    capture, so call each launcher once (warm-up) before capturing. Launches that share the
    counters must not run concurrently on different streams.
    """
    key = (name, device.type, device.index)
    buf = _LOCKS.get(key)
    require(buf is None or buf.dtype == dtype, f"counters {name!r} are {None if buf is None else buf.dtype}, asked for {dtype}")
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelArgumentError("dustin_kernels: run each kernel once before CUDA graph capture (warm-up)")
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros(max(n, 4096), dtype=dtype, device=device)
        _LOCKS[key] = buf
    return buf


def check_lens(cache_lens: torch.Tensor, B: int, device: torch.device) -> None:
    require(cache_lens.dtype == torch.int32, f"cache_lens must be int32, got {cache_lens.dtype}")
    require(tuple(cache_lens.shape) == (B,), f"cache_lens must have shape [{B}], got {list(cache_lens.shape)}")
    require(cache_lens.device == device, "cache_lens must be on the same device as q")
    require(cache_lens.is_contiguous(), "cache_lens must be contiguous")


def check_out(out: torch.Tensor | None, shape: tuple, dtype: torch.dtype, device: torch.device, name: str = "out"):
    """Return `out` after checking it, or a fresh torch.empty of the given shape."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    require(tuple(out.shape) == tuple(shape), f"{name} must have shape {list(shape)}, got {list(out.shape)}")
    require(out.dtype == dtype, f"{name} must be {dtype}, got {out.dtype}")
    require(out.device == device, f"{name} must be on {device}")
    return out
