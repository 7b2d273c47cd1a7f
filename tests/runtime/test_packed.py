"""Low-bit group storage (dustin_runtime/packed.py): the round trip at every width, exactness on
values already on the grid (the target's Q4_1 layers), a grouped checkpoint loading as the values it
stores, and one clear error for incomplete entries."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dustin_runtime import packed
from dustin_runtime.attention import TorchAttention
from dustin_runtime.errors import DustinError
from dustin_runtime.loader import load_model

EPS16 = 2.0**-11  # float16 relative rounding


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("shape", [(7, 96), (1, 32), (13, 160)])
def test_round_trip_and_error_bound(bits, shape):
    g = torch.Generator().manual_seed(bits * 100 + shape[0])
    w = (torch.randn(shape[1], shape[0], generator=g) * 0.3 + 0.05).T  # non-contiguous [R, C]
    stored = packed.pack("w", w, bits)
    assert stored[f"w.q{bits}"].dtype == torch.uint8 and stored[f"w.q{bits}"].shape == (shape[0], shape[1] * bits // 8)
    out = packed.unpack(stored[f"w.q{bits}"], bits, stored["w.q_scale"], stored["w.q_min"])
    assert torch.equal(out, packed.dequantize(*packed.quantize(w, bits)))
    # |w - stored| <= half a level, plus the float16 rounding of the minimum and of the level size
    # (which the top level multiplies): per group of 32
    top = 2**bits - 1
    grp = w.reshape(shape[0], -1, 32)
    mag = grp.abs().amax(-1, keepdim=True)
    d = stored["w.q_scale"].float()[..., None]
    bound = 0.5 * d + (top + 2) * EPS16 * 2 * mag + 1e-7
    assert ((out.reshape_as(grp) - grp).abs() <= bound).all()


@pytest.mark.parametrize("bits", [4, 6])
def test_values_on_the_grid_round_trip_exactly(bits):
    """A Q4_1 tensor (levels 0..15 with the extremes in each group, float16 scale and minimum)
    is stored without loss: the target's GGUF layers copied into a draft keep their values."""
    g = torch.Generator().manual_seed(7)
    top = 2**bits - 1
    levels = torch.randint(0, top + 1, (5, 64), generator=g, dtype=torch.uint8)
    levels[:, 0::32], levels[:, 1::32] = 0, top  # each group spans the whole range
    d = (torch.rand(5, 2, generator=g) * 0.02 + 1e-3).half()
    mn = (torch.randn(5, 2, generator=g) * 0.1).half()
    w = packed.dequantize(levels, d, mn)
    q2, d2, mn2 = packed.quantize(w, bits)
    assert torch.equal(q2, levels) and torch.equal(d2, d) and torch.equal(mn2, mn)


def test_fake_quant_is_the_stored_value_with_identity_gradient():
    w = torch.randn(3, 64, requires_grad=True)
    y = packed.fake_quant(w, 4)
    stored = packed.dequantize(*packed.quantize(w, 4))
    assert ((y.detach() - stored).abs() <= 4 * 2.0**-24 * (w.abs() + stored.abs())).all()  # w + (s - w) in fp32
    y.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def _grouped_copy(src, dst, bits_of):
    """dst: src's checkpoint with every 2-D tensor stored at bits_of(name) bits."""
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    out, expect = {}, {}
    for name, t in load_file(src / "model.safetensors").items():
        if t.dim() == 2:
            out.update(packed.pack(name, t, bits_of(name)))
            expect[name] = packed.dequantize(*packed.quantize(t, bits_of(name)))
        else:
            out[name] = t
            expect[name] = t.float()
    save_file(out, dst / "model.safetensors")
    return expect


def test_grouped_checkpoint_loads_as_its_stored_values(tiny_hf, tmp_path):
    folder, _ = tiny_hf("llama3", seed=61)  # hidden 64, MLP 96, untied head, vocab 131
    expect = _grouped_copy(folder, tmp_path / "grouped", lambda n: 6 if "embed" in n else 4)
    same = tmp_path / "same"  # the stored values written plainly
    _grouped_copy(folder, same, lambda n: 4)
    save_file({k: v.contiguous() for k, v in expect.items()}, same / "model.safetensors")
    model, _ = load_model(str(tmp_path / "grouped"))
    ref, _ = load_model(str(same))
    orig, _ = load_model(str(folder))
    for (n, p), (n2, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert n == n2 and torch.equal(p, q), n
    x = torch.randint(0, 131, (2, 11))
    a = model(x, model.allocate_cache(2, 11), TorchAttention())
    assert torch.equal(a, ref(x, ref.allocate_cache(2, 11), TorchAttention()))
    assert not torch.equal(a, orig(x, orig.allocate_cache(2, 11), TorchAttention()))  # rounding shows


def test_incomplete_entries_are_one_clear_error(tiny_hf, tmp_path):
    folder, _ = tiny_hf("llama3", seed=62)
    _grouped_copy(folder, tmp_path / "g", lambda n: 4)
    sd = load_file(tmp_path / "g" / "model.safetensors")
    victim = next(k for k in sd if k.endswith(".q_min"))
    del sd[victim]
    save_file(sd, tmp_path / "g" / "model.safetensors")
    with pytest.raises(DustinError, match=r"lacks .*q_min") as e:
        load_model(str(tmp_path / "g"))
    assert "\n" not in str(e.value)
    assert json.loads((tmp_path / "g" / "config.json").read_text())["model_type"] == "llama"
