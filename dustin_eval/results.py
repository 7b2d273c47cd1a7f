"""Result files shared by the harnesses: JSON/CSV/Markdown tables, score-vs-budget plots.

Every result records what made it (`dustin_runtime.io.provenance.provenance`: model ids, shapes,
device, library versions, git commit, command line and time). Plots use matplotlib's Agg canvas
directly (no pyplot, no global backend).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dustin_runtime.io.files import atomic_path, atomic_write

# Transitional: passkey_eval, pg19_eval, longbench_runner and dustin/cli.py still import
# `provenance` from here; it is defined in dustin_runtime.io.provenance.

SCHEMA_VERSION = 1


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
    """PNG: one line of `value` vs budget per policy, with interval bars where rows carry
    `<value>_lo` / `<value>_hi`; budget None (full cache) as a dashed level."""
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
            bars = sorted((int(r["budget"]), float(r[value]), float(r[f"{value}_lo"]), float(r[f"{value}_hi"]))
                          for r in rows if str(r["policy"]) == policy and r.get("budget") is not None
                          and r.get(f"{value}_lo") is not None)
            if bars:  # intervals where the rows have them (<value>_lo, <value>_hi)
                ax.errorbar([b for b, *_ in bars], [v for _, v, _, _ in bars],
                            yerr=[[v - lo for _, v, lo, _ in bars], [hi - v for _, v, _, hi in bars]],
                            fmt="none", capsize=3, color=ax.lines[-1].get_color())
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
