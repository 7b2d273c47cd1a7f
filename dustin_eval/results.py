"""Result files shared by the harnesses: provenance, JSON/CSV/Markdown tables, score-vs-budget plots.

Every result records what made it: model ids, shapes, device, library versions, git commit,
command line and time. Plots use matplotlib's Agg canvas directly (no pyplot, no global backend).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from dustin_runtime.files import atomic_path, atomic_write

SCHEMA_VERSION = 1
_REPO = Path(__file__).resolve().parents[1]


def git_commit(repo_dir: str | Path | None = None) -> str:
    """$DUSTIN_GIT_COMMIT when set (device commands: their copy's .git can lag the working tree);
    else `git rev-parse HEAD` (+ "-dirty" with uncommitted changes); else "unknown"."""
    if os.environ.get("DUSTIN_GIT_COMMIT"):
        return os.environ["DUSTIN_GIT_COMMIT"]
    cwd = Path(repo_dir) if repo_dir is not None else _REPO
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("DUSTIN_GIT_COMMIT", "unknown")
    return (
        head + ("-dirty" if dirty else "")
        if head
        else os.environ.get("DUSTIN_GIT_COMMIT", "unknown")
    )


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def device_info() -> dict[str, Any]:
    """The accelerator (CUDA name and count) or the CPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return {
                "device": torch.cuda.get_device_name(0),
                "device_count": torch.cuda.device_count(),
                "cuda": torch.version.cuda,
            }
    except ImportError:
        pass
    return {"device": f"cpu ({platform.machine()})", "device_count": 0, "cuda": None}


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
        "versions": {
            "python": platform.python_version(),
            **{p: _version(p) for p in ("dustin", "torch", "transformers", "triton")},
        },
        "git_commit": git_commit(),
        "command": list(sys.argv),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **dict(extra or {}),
    }


def write_result_json(
    path: str | Path, rows: Sequence[Mapping[str, Any]], prov: Mapping[str, Any], **fields
) -> Path:
    """JSON result file: `schema_version`, `provenance`, `rows` and any extra top-level fields."""
    doc = {"schema_version": SCHEMA_VERSION, "provenance": dict(prov), **fields, "rows": list(rows)}
    return atomic_write(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None) -> list[str]:
    if columns is not None:
        return list(columns)
    out: list[str] = []
    for row in rows:
        out += [k for k in row if k not in out]
    return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return format(round(v, 4), "g")
    return str(v)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub Markdown table of the rows (missing cells empty)."""
    cols = _columns(rows, columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        cells = [_cell(row.get(c)).replace("|", "\\|").replace("\n", " ") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(
    path: str | Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None
) -> Path:
    """CSV of the rows, columns in first-seen order unless given (written atomically)."""
    cols = _columns(rows, columns)
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c) for c in cols})
    return atomic_write(path, buf.getvalue())


def write_markdown(
    path: str | Path,
    title: str,
    tables: Sequence[tuple[str | None, str]],
    prov: Mapping[str, Any],
) -> Path:
    """A Markdown file: title, provenance lines (command, commit, device, models), then tables."""
    command = " ".join(prov.get("command", []))
    head = [
        f"# {title}",
        "",
        f"- command: `{command}`",
        f"- git commit: `{prov.get('git_commit')}`",
        f"- device: {prov.get('device')}",
        f"- models: {json.dumps(prov.get('models', {}))}",
        f"- time (UTC): {prov.get('timestamp')}",
        "",
    ]
    body = []
    for heading, table in tables:
        if heading:
            body += [f"## {heading}", ""]
        body += [table]
    return atomic_write(path, "\n".join(head + body))


def plot_score_vs_budget(
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    value: str = "score",
    title: str | None = None,
    ylabel: str | None = None,
) -> Path:
    """PNG: one line of `value` vs budget per policy; budget None (full cache) as a dashed level."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    policies = list(dict.fromkeys(str(r["policy"]) for r in rows))
    budgets = sorted({int(r["budget"]) for r in rows if r.get("budget") is not None})
    for policy in policies:
        points = sorted(
            (int(r["budget"]), float(r[value]))
            for r in rows
            if str(r["policy"]) == policy and r.get("budget") is not None
        )
        if points:
            ax.plot([b for b, _ in points], [v for _, v in points], marker="o", label=policy)
        for r in rows:
            if str(r["policy"]) == policy and r.get("budget") is None:
                ax.axhline(float(r[value]), linestyle="--", color="gray", linewidth=1)
                ax.annotate(
                    policy if "full" in policy else f"{policy} (full cache)",
                    (0.01, float(r[value])),
                    xycoords=("axes fraction", "data"),
                    fontsize=8,
                    va="bottom",
                )
    if len(budgets) > 1 and budgets[0] > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("KV budget (tokens)")
    ax.set_ylabel(ylabel or value)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if any(r.get("budget") is not None for r in rows):
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=150)
    return Path(path)
