"""Short hub ids (`--target Qwen2.5-72B`): the instruct, else the base checkpoint of that name in the
local Hugging Face cache (any owner, any case), or one line naming the ids looked for and where."""

import shutil

import pytest

from dustin_runtime.errors import DustinError
from dustin_runtime.loader import read_config, resolve_checkpoint


def cached(root, repo_id, folder, rev="0123456789abcdef", ref=True):
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / rev)
    if ref:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(rev)
    return repo / "snapshots" / rev


def test_short_name_takes_the_instruct_then_the_base(tiny_hf, tmp_path, monkeypatch):
    folder, _ = tiny_hf("qwen2", seed=5)
    hub = tmp_path / "hf" / "hub"
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # $HF_HOME/hub
    base = cached(hub, "Qwen/Qwen2.5-72B", folder, ref=False)
    ckpt = resolve_checkpoint("qwen2.5-72b")  # any case
    assert (ckpt.kind, ckpt.model_id, ckpt.path) == ("hf", "Qwen/Qwen2.5-72B", base)
    inst = cached(hub, "Qwen/Qwen2.5-72B-Instruct", folder)
    ckpt = resolve_checkpoint("Qwen2.5-72B")
    assert (ckpt.model_id, ckpt.path) == ("Qwen/Qwen2.5-72B-Instruct", inst)
    assert read_config(ckpt).num_layers == 2


def test_absent_name_names_the_ids_and_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DustinError) as e:
        resolve_checkpoint("Qwen2.5-72B")
    msg = str(e.value)
    assert "Qwen/Qwen2.5-72B-Instruct or Qwen/Qwen2.5-72B" in msg and str(tmp_path / "empty") in msg
    assert "\n" not in msg
    with pytest.raises(DustinError, match="no such checkpoint folder"):
        resolve_checkpoint(str(tmp_path / "missing"))  # a path stays a path
