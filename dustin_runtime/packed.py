"""Low-bit group storage of checkpoint tensors (GGUF's Q4_1 layout, at any width of 2-8 bits): per
group of 32 consecutive values along a row, a float16 scale d and minimum m, each value q * d + m
with q in 0..2^bits - 1, the levels bit-packed. Drafts built from the target's own layers are
stored this way (`scripts/draft/train.py --init-layers`, results/draft-training/target-layers): the target's
GGUF holds those layers as Q4_1, so 4 bits round-trip them exactly. The loader expands such tensors
on read, so a grouped checkpoint loads wherever a plain one does.

A tensor `name` of shape [R, C] (C a multiple of 32) stored at b bits is three entries:
  name.q{b}     uint8   [R, C * b // 8]   (levels, most significant bit first, row-major)
  name.q_scale  float16 [R, C // 32]
  name.q_min    float16 [R, C // 32]
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import torch

GROUP = 32
BITS = range(2, 9)
_LEVELS = re.compile(r"^(.*)\.q([2-8])$")


def quantize(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[R, C] float -> (levels uint8 [R, C], scale fp16 [R, C/32], min fp16 [R, C/32])."""
    if bits not in BITS:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    if w.dim() != 2 or w.shape[1] % GROUP:
        raise ValueError(f"group storage needs a 2-D tensor whose rows are a multiple of {GROUP}, got {tuple(w.shape)}")
    top = 2**bits - 1
    g = w.detach().float().reshape(w.shape[0], -1, GROUP)  # [R, C/32, 32]
    lo, hi = g.amin(-1), g.amax(-1)  # [R, C/32]
    mn = lo.to(torch.float16)
    d = ((hi - mn.float()) / top).to(torch.float16)
    df = d.float().clamp_min(torch.finfo(torch.float16).tiny)
    q = torch.round((g - mn.float()[..., None]) / df[..., None]).clamp_(0, top).to(torch.uint8)
    return q.reshape(w.shape), d, mn


def dequantize(q: torch.Tensor, d: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Levels [R, C] uint8, scale / min [R, C/32] -> float32 [R, C]."""
    if q.shape[1] != d.shape[1] * GROUP or d.shape != mn.shape or q.shape[0] != d.shape[0]:
        raise ValueError(f"stored entries disagree: levels {tuple(q.shape)}, scales {tuple(d.shape)}, "
                         f"minima {tuple(mn.shape)}")
    g = q.float().reshape(q.shape[0], -1, GROUP)
    return (g * d.float()[..., None] + mn.float()[..., None]).reshape(q.shape)


def fake_quant(w: torch.Tensor, bits: int) -> torch.Tensor:
    """The value `w` is stored as, with the gradient of the identity (straight-through): for
    training a model that will be stored at `bits`."""
    return w + (dequantize(*quantize(w, bits)).to(w.dtype) - w).detach()


def _pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Levels [R, C] -> [R, C * bits / 8] bytes, each level's low `bits` bits, MSB first."""
    a = np.unpackbits(q.cpu().numpy()[..., None], axis=-1)[..., 8 - bits:]  # [R, C, bits]
    return torch.from_numpy(np.packbits(a.reshape(q.shape[0], -1), axis=-1))


def _unpack_bits(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """Inverse of _pack_bits: [R, cols * bits / 8] bytes -> levels [R, cols] uint8."""
    a = np.unpackbits(packed.cpu().numpy(), axis=-1).reshape(packed.shape[0], cols, bits)
    full = np.concatenate([np.zeros(a.shape[:2] + (8 - bits,), np.uint8), a], axis=-1)
    return torch.from_numpy(np.packbits(full, axis=-1)[..., 0])


def pack(name: str, w: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """The three stored entries of tensor `name` at `bits`."""
    q, d, mn = quantize(w, bits)
    return {f"{name}.q{bits}": _pack_bits(q, bits), name + ".q_scale": d.contiguous(), name + ".q_min": mn.contiguous()}


def unpack(packed: torch.Tensor, bits: int, d: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Stored entries -> float32 [R, C]."""
    if packed.dtype != torch.uint8 or packed.dim() != 2 or (packed.shape[1] * 8) % bits:
        raise ValueError(f"{bits}-bit levels must be a 2-D uint8 tensor of whole levels, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    return dequantize(_unpack_bits(packed, bits, packed.shape[1] * 8 // bits), d, mn)


def expand_getter(get: Callable, names: set[str]) -> tuple[Callable, set[str]]:
    """Wrap a checkpoint's tensor getter (name, index) so that group-stored tensors read as plain
    float32 tensors under their own name (expanded whole, then indexed); other names pass through.
    A tensor with some but not all of its entries is an error (ValueError)."""
    bits = {}
    for n in names:
        m = _LEVELS.match(n)
        if m:
            if m.group(1) in bits:
                raise ValueError(f"tensor {m.group(1)} is stored at two widths")
            bits[m.group(1)] = int(m.group(2))
    for b in bits:
        missing = [b + s for s in (".q_scale", ".q_min") if b + s not in names]
        if missing:
            raise ValueError(f"stored tensor {b} lacks {', '.join(missing)}")
    stray = [n for n in names if n.endswith((".q_scale", ".q_min")) and n.rsplit(".", 1)[0] not in bits]
    if stray:
        raise ValueError(f"scales or minima without levels: {', '.join(sorted(stray))}")
    if not bits:
        return get, names

    def read(name: str, index=None) -> torch.Tensor:
        if name not in bits:
            return get(name, index)
        b = bits[name]
        w = unpack(get(f"{name}.q{b}", None), b, get(name + ".q_scale", None), get(name + ".q_min", None))
        return w if index is None else w[index]

    plain = {n for n in names if not (_LEVELS.match(n) or n.endswith((".q_scale", ".q_min")))}
    return read, plain | set(bits)
