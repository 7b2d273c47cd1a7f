"""PNG plots beside a profile, drawn from its parquet tables: per-layer ARR of the draft vs the
target signal (complementarity), ARR over the greedy rounds and ARR vs budget of every method."""

from __future__ import annotations

from pathlib import Path

from dustin_profile.artifact import Profile
from dustin_runtime.io.files import atomic_path

STYLE = {
    "dustin": dict(color="C3", lw=2.2, marker="o"),
    "draft-only": dict(color="C0", ls="--"),
    "target-only": dict(color="C1", ls="--"),
    "chosen draft heads": dict(color="C0"),
    "chosen target heads": dict(color="C1"),
    "streamingllm": dict(color="C7", ls=":"),
    "quest": dict(color="C2", ls="-."),
    "oracle": dict(color="k", ls=":"),
    "layer-oracle": dict(color="k", ls="--"),
}


def _title(prof: Profile, what: str) -> str:
    return (f"{what}\ntarget {prof.target.id} / draft {prof.draft.id}, context {prof.calibration.get('context')}, "
            f"S = {prof.budget}")


def write_plots(out: Path, prof: Profile) -> dict[str, str]:
    """Write the three plots next to `out` (needs the tables written already)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import pandas as pd

    def table(name):
        return pd.read_parquet(out.parent / prof.tables[name])

    names = {}

    def save(fig, ax, name, title, xlabel, ylabel, **legend):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(_title(prof, title), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(**{"fontsize": 8, **legend})
        path = out.with_suffix(f".{name}.png")
        fig.tight_layout()
        try:
            with atomic_path(path) as tmp:
                fig.savefig(tmp, dpi=110)
        finally:
            plt.close(fig)
        names[f"plot_{name}"] = path.name

    layers = table("layers")
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for method, df in layers.groupby("method", sort=False):
        ax.plot(df["layer"], df["arr"], label=method, **STYLE.get(method, {}))
    save(fig, ax, "complementarity", "Per-layer ARR: draft lookahead vs target history signal", "target layer",
         "ARR of the layer's attention")

    rounds = table("rounds")
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(rounds["round"], rounds["arr"], **STYLE["dustin"], label="dustin (greedy)")
    for _, r in rounds.iterrows():
        if isinstance(r["added"], str):
            ax.annotate(f"{r['added']}\nm={r['m']}", (r["round"], r["arr"]), fontsize=7,
                        textcoords="offset points", xytext=(0, -22), ha="center")
    for k, v in prof.arr_baselines.items():
        ax.axhline(v, label=k, **{kk: vv for kk, vv in STYLE.get(k, {}).items() if kk != "marker"})
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    save(fig, ax, "rounds", "ARR over the greedy rounds of Algorithm 1", "greedy round (heads chosen)", "ARR",
         fontsize=7, loc="lower right")

    budgets = table("budgets")
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for method, df in budgets.groupby("method", sort=False):
        ax.plot(df["budget"], df["arr"], label=method, **{"marker": ".", **STYLE.get(method, {})})
    ax.set_xscale("log", base=2)
    save(fig, ax, "budget", "ARR vs budget", "budget S (tokens)", "ARR")

    return names
