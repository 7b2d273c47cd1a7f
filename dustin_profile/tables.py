"""The parquet tables beside a profile: the greedy rounds, every candidate evaluation of every
round, ARR vs budget of every method, the per-layer ARR of each signal and the per-layer oracle."""

from __future__ import annotations

from pathlib import Path

from dustin_profile.baselines import baseline_arrs, oracle_by_layer
from dustin_profile.calib_arr import CalibStats, layer_arr, select
from dustin_profile.candidates import Candidate
from dustin_profile.search import SearchResult, signal_sums
from dustin_runtime.io.files import atomic_path


def write_tables(out: Path, cfg, stats: CalibStats, cands: list[Candidate], res: SearchResult,
                 sweep: dict, command: str) -> dict[str, str]:
    """The parquet tables beside the JSON: rounds, candidates (every evaluation of every round),
    budgets (ARR vs budget of every method) and layers (per-layer ARR of each signal)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    rounds = pd.DataFrame([{
        "round": r.index, "added": r.added.label if r.added else None,
        "model": r.added.model if r.added else None, "layer": r.added.layer if r.added else None,
        "kv_head": r.added.kv_head if r.added else None, "m": r.m, "arr": r.arr, "gain": r.gain,
        "heads": len([x for x in res.rounds[: r.index + 1] if x.added]),
    } for r in res.rounds])
    chosen_at = {c: i + 1 for i, c in enumerate(res.chosen)}
    candidates = pd.DataFrame([{
        "round": r.index, "model": cands[c].model, "layer": cands[c].layer, "kv_head": cands[c].kv_head,
        "arr": a, "m": mm, "gain": a - res.rounds[r.index - 1].arr, "chosen": chosen_at.get(c) == r.index,
    } for r in res.rounds for (c, a, mm) in r.evaluations])
    rows = []
    for b in cfg.all_budgets:
        rows.append({"method": "dustin", "budget": b, "arr": sweep[b][0], "m": sweep[b][1]})
        for k, v in baseline_arrs(stats, b, cfg.sinks, cfg.window).items():
            rows.append({"method": k, "budget": b, "arr": v, "m": None})
    budgets = pd.DataFrame(rows)
    free = cfg.budget - cfg.sinks - cfg.window
    prim, sec = signal_sums(stats, cands, res.chosen)
    alld, allt = stats.draft.sum(0), stats.target.sum(0)
    sets = {"draft-only": (alld, None, free), "target-only": (None, allt, 0)}
    if res.draft_heads:
        sets["chosen draft heads"] = (prim, None, free)
    if res.target_heads:
        sets["chosen target heads"] = (None, sec, 0)
    sets["dustin"] = (prim, sec, sweep[cfg.budget][1])
    layer_rows = []
    for name, (p, s, m) in sets.items():
        idx = select(stats, p, s, budget=cfg.budget, sinks=cfg.sinks, window=cfg.window, m=m)
        for layer, v in enumerate(layer_arr(stats, idx).tolist()):
            layer_rows.append({"method": name, "layer": layer, "arr": v})
    for layer, v in enumerate(stats.average(oracle_by_layer(stats, cfg.budget).T).tolist()):
        layer_rows.append({"method": "layer-oracle", "layer": layer, "arr": v})
    layers = pd.DataFrame(layer_rows)
    frames = [("rounds", rounds), ("candidates", candidates), ("budgets", budgets), ("layers", layers)]
    names = {}
    meta = {b"command": command.encode()}
    for name, df in frames:
        path = out.with_suffix(f".{name}.parquet")
        table = pa.Table.from_pandas(df, preserve_index=False)
        with atomic_path(path) as tmp:
            pq.write_table(table.replace_schema_metadata({**(table.schema.metadata or {}), **meta}), tmp)
        names[name] = path.name
    return names
