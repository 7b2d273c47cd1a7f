"""Hub ids as papers write them: `--target Qwen2.5-72B` is the instruct or the base checkpoint of that
name (any owner, names compared case-insensitively) already in the local Hugging Face cache; nothing
is downloaded. The cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub; a
cached model is models--OWNER--NAME/snapshots/REVISION (the one refs/main names, else the newest)."""

from __future__ import annotations

import os
from pathlib import Path

from dustin_runtime.errors import DustinError


def cache_dir() -> Path:
    """The Hugging Face hub cache folder this process would read."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def wanted(name: str) -> tuple[str, ...]:
    """The repository names a short name stands for: NAME-Instruct first, then NAME."""
    base = name.removesuffix("-Instruct") if name.lower().endswith("-instruct") else name
    return (f"{base}-Instruct", base)


def _owners(name: str) -> list[str]:
    """Owners of the presets' checkpoints of that name (for the message: e.g. Qwen for Qwen2.5-72B)."""
    from dustin_runtime.presets import PRESETS

    keys = {n.lower() for n in wanted(name)}
    return sorted({c.name.split("/")[0] for c in PRESETS.values()
                   if "/" in c.name and c.name.split("/")[1].lower() in keys}) or ["*"]


def snapshot(repo: Path) -> Path | None:
    """The snapshot folder of a cached repository holding a config.json (refs/main's, else the newest)."""
    snaps = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        main = snaps / ref.read_text().strip()
        if (main / "config.json").is_file():
            return main
    found = sorted((s for s in snaps.glob("*") if (s / "config.json").is_file()), key=lambda s: s.stat().st_mtime)
    return found[-1] if found else None


def resolve(name: str) -> tuple[str, Path]:
    """(hub id, snapshot folder) of a short name in the cache, or one line naming the ids looked
    for and the folder."""
    root = cache_dir()
    repos = {}
    if root.is_dir():
        for d in root.glob("models--*--*"):
            owner, _, repo = d.name.removeprefix("models--").partition("--")
            repos.setdefault(repo.lower(), []).append((owner, d))
    for want in wanted(name):
        for owner, d in sorted(repos.get(want.lower(), [])):
            snap = snapshot(d)
            if snap is not None:
                return f"{owner}/{d.name.partition('--')[2].partition('--')[2]}", snap
    ids = " or ".join(f"{o}/{w}" for w in wanted(name) for o in _owners(name))
    raise DustinError(f"{name}: no such folder or file, and neither {ids} is in the Hugging Face cache {root} "
                      "(offline: downloads are off; fetch it there or pass a local folder)")
