"""`dustin profile show`: a profile artifact as rich tables (plus its parquet tables when present)."""

from __future__ import annotations

from pathlib import Path

from dustin_profile.artifact import Profile
from dustin_runtime.errors import DustinError

COLUMNS = {"budgets": ("method", "budget", "arr", "m"), "rounds": ("round", "added", "m", "arr", "gain")}


def _table(prof: Profile, folder: Path | None, name: str):
    """A parquet table named in the profile as a DataFrame, None when absent; a damaged one, or one
    without the expected columns, is refused with one line."""
    if folder is None or name not in prof.tables or not (folder / prof.tables[name]).is_file():
        return None
    import pandas as pd

    path = folder / prof.tables[name]
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        first = (str(e).strip().splitlines() or [""])[0]
        raise DustinError(f"{path}: not a readable parquet table ({type(e).__name__}: {first})") from None
    missing = [c for c in COLUMNS[name] if c not in df.columns]
    if missing:
        raise DustinError(f"{path}: not a profile {name} table (no column {missing[0]!r})")
    bad = _damage(df, name)
    if bad:
        raise DustinError(f"{path}: not a profile {name} table ({bad})")
    return df


def _damage(df, name: str) -> str | None:
    """What makes a table with the right columns unprintable (wrong types, gaps, duplicates), or None."""
    import pandas as pd

    numeric = {"budgets": ("budget", "arr", "m"), "rounds": ("round", "m", "arr", "gain")}[name]
    for c in numeric:
        if not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            return f"column {c!r} holds {df[c].dtype}, not numbers"
    for c in ("budget", "arr") if name == "budgets" else ("round", "m", "arr"):
        if df[c].isna().any():
            return f"column {c!r} has empty cells"
    if name == "rounds":
        return None
    if not all(isinstance(v, str) for v in df["method"]):
        return "column 'method' must hold names"
    if df.duplicated(["method", "budget"]).any():
        return "a method appears twice at one budget"
    ours = df[df.method == "dustin"]
    if set(ours["budget"]) != set(df["budget"]) or ours["m"].isna().any():
        return "dustin's row (with its m) is missing at some budget"
    return None


def _sub(d: dict, key: str) -> dict:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _num(d: dict, key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _added(r) -> str:
    """A rounds-table row's added head: '-' for round 0, '(stop)' for the round that gained too little."""
    if isinstance(r["added"], str):
        return r["added"]
    return "(stop)" if r["round"] else "-"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.2%}"


def _place(p: str) -> str:
    """A model id or file as this machine can show it: a path relative to the working folder when
    inside it, else the file's name (the author's absolute path proves nothing here)."""
    import os

    if not os.path.isabs(p):
        return p
    rel = os.path.relpath(p)
    return rel if not rel.startswith("..") else f"{Path(p).name} (on the machine that made it)"


def _made_by(prof: Profile) -> str:
    """Schema, and the tool version and commit where the profile records them."""
    parts = [f"schema {prof.schema_version}"]
    if prof.tool_version not in ("", "unknown"):
        parts.append(f"dustin {prof.tool_version}")
    if prof.git_commit not in ("", "unknown"):
        parts.append(f"commit {prof.git_commit[:14]}")
    return ", ".join(parts)


def _ratio(d: dict, key: str) -> str:
    v = _num(d, key)
    return "?" if v is None else f"{v:.4f}"


def render(prof: Profile, folder: Path | None = None) -> list:
    """Rich renderables: summary, heads, ARR vs baselines, m by budget, ARR vs budget, rounds."""
    from rich.table import Table

    out = []
    t = Table(title="profile", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    cal = prof.calibration
    rows = [
        ("made by", _made_by(prof)),
        ("created", prof.created),
    ]
    for who, info in (("target", prof.target), ("draft", prof.draft)):
        rows.append((who, f"{_place(info.id)}: {info.num_layers} layers x {info.num_heads} heads ({info.num_kv_heads} KV, "
                          f"head dim {info.head_dim}); config {info.config_hash}, tokenizer {info.tokenizer_hash}"))
    rows += [
        ("gamma / budget / sinks / window", f"{prof.gamma} / {prof.budget} / {prof.sinks} / {prof.window}"),
        ("m (draft share of the budget)", f"{prof.m} of {prof.budget - prof.sinks - prof.window}"),
        ("ARR", f"{prof.arr:.4f}"),
        ("estimator cost", f"{_pct(_num(prof.online_cost, 'share'))} of the full cache's bytes per step "
                           f"({prof.online_cost.get('draft_kv_heads')} draft + {prof.online_cost.get('target_kv_heads')}"
                           f" target KV heads)"),
        ("calibration", str(cal.get("description", ""))),
        ("calibration sha256", str(cal.get("sha256", ""))[:16]),
    ]
    rs = prof.refresh_search
    if rs.get("skipped"):
        rows.append(("refresh layers", f"not searched: {rs['skipped']}"))
    elif rs:
        held = _sub(rs, "heldout")
        rows.append(("refresh layers", f"{list(prof.refresh_layers)} (up to {rs.get('max_refresh')}, stop: "
                                       f"{rs.get('stop')}); ppl ratio to full {_ratio(rs, 'ppl_ratio')} vs "
                                       f"{_ratio(rs, 'ppl_ratio_without')} without"
                                       + (f"; held out {_ratio(held, 'dustin + refresh')} vs "
                                          f"{_ratio(held, 'dustin')}" if held else "")))
    if _num(cal, "mean_accepted") is not None:
        rows.append(("mean accepted drafts", f"{_num(cal, 'mean_accepted'):.2f} of {prof.gamma}"))
    run = _sub(cal, "run")
    if run:
        rows.append(("run", f"{run.get('device')} {run.get('dtype')}, {_sub(run, 'seconds').get('total')} s"))
        if run.get("command"):
            rows.append(("command", " ".join(_place(w) for w in str(run["command"]).split())))
    for k, v in rows:
        t.add_row(k, v)
    out.append(t)

    t = Table(title="retrieval heads (KV-head granularity)")
    for c in ("model", "layer", "KV head", "query heads"):
        t.add_column(c, justify="right" if c != "model" else "left")
    for who, heads in (("draft", prof.draft_heads), ("target", prof.target_heads)):
        for h in heads:
            t.add_row(who, str(h.layer), str(h.kv_head), ",".join(map(str, h.query_heads)))
    out.append(t)

    t = Table(title=f"ARR at S = {prof.budget} on the calibration passes")
    t.add_column("method")
    t.add_column("ARR", justify="right")
    t.add_column("vs dustin", justify="right")
    t.add_row("[bold]dustin[/]", f"[bold]{prof.arr:.4f}[/]", "")
    for k, v in prof.arr_baselines.items():
        t.add_row(k, f"{v:.4f}", f"{v - prof.arr:+.4f}")
    out.append(t)
    held = _sub(prof.heldout, "arr")
    if held:
        t = Table(title=f"ARR at S = {prof.budget} on {prof.heldout.get('passes')} held-out passes")
        t.add_column("method")
        t.add_column("ARR", justify="right")
        for k, v in held.items():
            t.add_row(k, f"{v:.4f}")
        out.append(t)

    df = _table(prof, folder, "budgets")
    if df is not None:
        wide = df.pivot(index="method", columns="budget", values="arr")
        t = Table(title="ARR vs budget")
        t.add_column("method")
        for b in wide.columns:
            t.add_column(f"S={b}", justify="right")
        for method in df["method"].drop_duplicates():
            t.add_row(method, *(f"{wide.loc[method, b]:.4f}" for b in wide.columns))
        ms = df[df.method == "dustin"].set_index("budget")["m"]
        t.add_row("dustin m", *(str(int(ms[b])) for b in wide.columns))
        out.append(t)
    else:
        t = Table(title="m by budget")
        t.add_column("budget", justify="right")
        t.add_column("m", justify="right")
        for b, m in sorted(prof.m_by_budget.items()):
            t.add_row(str(b), str(m))
        out.append(t)

    df = _table(prof, folder, "rounds")
    if df is not None:
        t = Table(title="greedy rounds (Algorithm 1)")
        for c in ("round", "added", "m", "ARR", "gain"):
            t.add_column(c, justify="right")
        for _, r in df.iterrows():
            t.add_row(str(r["round"]), _added(r), str(r["m"]), f"{r['arr']:.4f}",
                      f"{r['gain']:+.4f}" if r["round"] else "")
        out.append(t)
    if prof.tables:
        out.append("beside it: " + ", ".join(sorted(prof.tables.values())))
    return out


def markdown(prof: Profile, folder: Path | None = None) -> str:
    """The ARR table (dustin vs every baseline, at S and across budgets), the heads and the greedy
    rounds as markdown, for results/ READMEs."""
    lines = [f"Target `{prof.target.id}`, draft `{prof.draft.id}`; gamma {prof.gamma}, S = {prof.budget}, "
             f"sinks {prof.sinks}, window {prof.window}, m = {prof.m}. {prof.calibration.get('description', '')}.", ""]
    budgets = _table(prof, folder, "budgets")
    if budgets is not None:
        budgets = budgets.pivot(index="method", columns="budget", values="arr")
    cols = [] if budgets is None else [b for b in budgets.columns if b != prof.budget]
    lines.append("| method | ARR at S = " + str(prof.budget) + " | " + " | ".join(f"S = {b}" for b in cols) + " |")
    lines.append("| --- | ---: |" + " ---: |" * len(cols))
    rows = [("**dustin**", prof.arr)]
    for name, v in (*rows, *prof.arr_baselines.items()):
        key = name.strip("*")
        extra = [f"{budgets.loc[key, b]:.4f}" for b in cols] if budgets is not None and key in budgets.index else [""] * len(cols)
        lines.append(f"| {name} | {v:.4f} | " + " | ".join(extra) + " |")
    lines += ["", "| model | layer | KV head | query heads |", "| --- | ---: | ---: | --- |"]
    for who, heads in (("draft", prof.draft_heads), ("target", prof.target_heads)):
        lines += [f"| {who} | {h.layer} | {h.kv_head} | {','.join(map(str, h.query_heads))} |" for h in heads]
    held = _sub(prof.heldout, "arr")
    if held:
        lines += ["", f"On {prof.heldout.get('passes')} held-out passes:", "", "| method | ARR |", "| --- | ---: |"]
        lines += [f"| {k} | {v:.4f} |" for k, v in held.items()]
    cost = prof.online_cost
    lines += ["", f"Estimator cost: {_pct(_num(cost, 'share'))} of the full K+V cache bytes per step "
                  f"({cost.get('draft_kv_heads')} draft + {cost.get('target_kv_heads')} target KV heads, one pass over their keys)."]
    df = _table(prof, folder, "rounds")
    if df is not None:
        lines += ["", "| round | added | m | ARR | gain |", "| ---: | --- | ---: | ---: | ---: |"]
        for _, r in df.iterrows():
            lines.append(f"| {r['round']} | {_added(r)} | {r['m']} | {r['arr']:.4f} | "
                         f"{r['gain']:+.4f} |")
    return "\n".join(lines) + "\n"


def show(path: Path, target: str | None, draft: str | None, as_markdown: bool, console) -> None:
    """`dustin profile show`: the profile as tables (or markdown); with a target / draft, refused
    unless made for them."""
    from dustin_profile.artifact import check_models, load_profile
    from dustin_profile.run import info_of

    prof = load_profile(path)
    if target or draft:
        check_models(prof, info_of(target) if target else prof.target, info_of(draft) if draft else prof.draft,
                     str(path))
    if as_markdown:
        print(markdown(prof, path.parent), end="")
        return
    for r in render(prof, path.parent):
        console.print(r)
    if target or draft:
        console.print(f"[green]{path} matches the given model(s)[/]")
