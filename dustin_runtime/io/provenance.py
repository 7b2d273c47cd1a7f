"""What made a result or an artifact: git commit, library versions, device, command line, time.

One definition for every writer: the harnesses' result files (`provenance`), the GPU benchmarks'
records (`environment`), the profile artifact (`git_commit`).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dustin", "torch", "transformers", "triton")


def git_commit(repo_dir: str | Path | None = None) -> str:
    """$DUSTIN_GIT_COMMIT when set (device commands: their copy's .git can lag the working tree);
    else `git rev-parse HEAD` of the repository (+ "-dirty" with uncommitted changes to tracked
    files); else "unknown"."""
    if os.environ.get("DUSTIN_GIT_COMMIT"):
        return os.environ["DUSTIN_GIT_COMMIT"]
    cwd = Path(repo_dir) if repo_dir is not None else REPO

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "") if head else "unknown"


def versions() -> dict[str, str | None]:
    """Python and the installed versions of dustin, torch, transformers and triton (None: absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def device_info() -> dict[str, Any]:
    """The accelerator (CUDA name and count) or the CPU."""
    import torch

    if torch.cuda.is_available():
        return {"device": torch.cuda.get_device_name(0), "device_count": torch.cuda.device_count(),
                "cuda": torch.version.cuda}
    return {"device": f"cpu ({platform.machine()})", "device_count": 0, "cuda": None}


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def provenance(
    models: Mapping[str, Any] | None = None,
    shapes: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What made a result: models, shapes, device, versions, git commit, command, UTC time."""
    return {
        "models": dict(models or {}),
        "shapes": dict(shapes or {}),
        **device_info(),
        "versions": versions(),
        "git_commit": git_commit(),
        "command": list(sys.argv),
        "timestamp": utc_now(),
        **dict(extra or {}),
    }


def environment(command: str) -> dict[str, Any]:
    """The GPU benchmarks' record of where they ran: CUDA device 0 (name, SMs, L2 bytes), versions,
    git commit, the command and the UTC time."""
    import torch

    props = torch.cuda.get_device_properties(0)
    v = versions()
    return {
        "gpu": torch.cuda.get_device_name(0),
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "triton": v["triton"],
        "cuda": torch.version.cuda,
        "python": v["python"],
        "git_commit": git_commit(),
        "command": command,
        "timestamp": utc_now(),
    }
