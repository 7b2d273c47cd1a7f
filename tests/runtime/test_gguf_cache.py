"""The GGUF conversion cache: written once with a stamp beside it; a cache file cut, garbled or
left without its stamp is detected and rebuilt, and the weights come back equal."""

import json

import torch

from dustin_runtime.loader import _gguf_cache_file, load_model


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_corrupt_cache_is_rebuilt(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DUSTIN_CACHE", str(tmp_path))
    ref = _state(load_model(str(tiny_gguf))[0])
    cached = _gguf_cache_file(tiny_gguf)
    stamp = cached.with_suffix(".stamp.json")
    assert cached.is_file() and json.loads(stamp.read_text())["size"] == cached.stat().st_size
    good = cached.read_bytes()
    for damage in ("cut", "garbled", "no stamp", "empty"):
        if damage == "cut":
            cached.write_bytes(good[: len(good) // 2])
        elif damage == "garbled":  # same size, other bytes: the stamp's mtime/sha256 catch it
            cached.write_bytes(good[:-4096] + bytes(4096))
        elif damage == "no stamp":
            stamp.unlink()
        else:
            cached.write_bytes(b"")
        model = load_model(str(tiny_gguf))[0]
        assert all(torch.equal(v, ref[k]) for k, v in _state(model).items()), damage
        assert cached.read_bytes() == good, damage  # rebuilt
        assert json.loads(stamp.read_text())["size"] == len(good)


def test_copied_cache_with_new_mtime_is_kept(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DUSTIN_CACHE", str(tmp_path))
    load_model(str(tiny_gguf))
    cached = _gguf_cache_file(tiny_gguf)
    data = cached.read_bytes()
    cached.unlink()
    cached.write_bytes(data)  # a copy: same bytes, another mtime -> verified by sha256, re-stamped
    before = json.loads(cached.with_suffix(".stamp.json").read_text())["mtime_ns"]
    load_model(str(tiny_gguf))
    assert json.loads(cached.with_suffix(".stamp.json").read_text())["mtime_ns"] == cached.stat().st_mtime_ns != before
