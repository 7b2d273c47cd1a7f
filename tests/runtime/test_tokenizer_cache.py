"""The GGUF tokenizer cache: built once, loaded back equal to the tokenizer built from the GGUF; a
cache file cut, emptied, garbled or of another format is rebuilt once (the next load leaves it
alone); a GGUF that changes gets a new cache file."""

import json
import os

from dustin_runtime.loader import resolve_checkpoint
from dustin_runtime.tokenizer import encode, load_tokenizer, tokenizer_cache_file, vocab_hash

TEXTS = ("Hello world", "  spaces\tand\nnewlines  ", "<|im_start|>user", "ünïcödé 123 !?")


def _same(a, b):
    assert vocab_hash(a) == vocab_hash(b)
    assert (a.bos_token_id, a.eos_token_id, a.chat_template) == (b.bos_token_id, b.eos_token_id, b.chat_template)
    for t in TEXTS:
        assert a.encode(t) == b.encode(t) and a.decode(a.encode(t)) == b.decode(b.encode(t)), t
    if a.chat_template:
        assert encode(a, "hi", chat=True) == encode(b, "hi", chat=True)


def test_built_once_and_rebuilt_when_damaged(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DUSTIN_CACHE", str(tmp_path))
    ckpt = resolve_checkpoint(str(tiny_gguf))
    cached = tokenizer_cache_file(ckpt)
    assert cached.parent == tmp_path / "tokenizers" and not cached.exists()
    built = load_tokenizer(ckpt)
    good = cached.read_bytes()
    assert json.loads(good)["files"]["tokenizer.json"]
    stamp = cached.stat().st_mtime_ns
    _same(load_tokenizer(ckpt), built)
    assert cached.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    broken = json.loads(good)
    broken["files"]["tokenizer.json"] = '{"model": 3}'
    damages = {"cut": good[: len(good) // 2], "empty": b"", "not json": b"\xff\xfe garbage",
               "broken tokenizer": json.dumps(broken).encode(), "other format": json.dumps({"format": -1}).encode()}
    for what, data in damages.items():
        cached.write_bytes(data)
        _same(load_tokenizer(ckpt), built)
        assert cached.read_bytes() == good, what  # rebuilt ...
        again = cached.stat().st_mtime_ns
        _same(load_tokenizer(ckpt), built)
        assert cached.stat().st_mtime_ns == again, what  # ... once


def test_changed_gguf_gets_a_new_cache_file(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DUSTIN_CACHE", str(tmp_path))
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    ckpt = resolve_checkpoint(str(copy))
    load_tokenizer(ckpt)
    first = tokenizer_cache_file(ckpt)
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert tokenizer_cache_file(ckpt) != first
    load_tokenizer(ckpt)
    assert len(list((tmp_path / "tokenizers").iterdir())) == 2
