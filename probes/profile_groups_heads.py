"""Layer groups at equal head counts: for each --max-heads h and K = 1..4 groups, the ARR of the best K
groups found by `dustin_profile.groups.search_groups` (h heads at most per group) on the calibration
windows of a profile's work folder, and on its held-out windows. Separates the gain of the groups
from the gain of more heads. CPU, minutes.

    python probes/profile_groups_heads.py profiles/smollm2-draft.work 4 4 probes/results/profile-groups-heads.json

(work folder, calibration windows, held-out windows, output JSON; the windows are the work
folder's w000.. files in order: calibration first, as `dustin profile --heldout-windows` records them.)
The target and draft are the SmolLM2 pair; S = 512, sinks 4, window 64, epsilon 1e-3 (the profile's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from dustin_profile.candidates import candidates_of
from dustin_profile.groups import search_groups
from dustin_profile.heldout import groups_arr
from dustin_profile.run import stack_windows
from dustin_profile.search import SearchConfig, greedy_search
from dustin_runtime.io.provenance import provenance
from dustin_runtime.loader import read_config, resolve_checkpoint


def main(work: str, n_cal: int, n_held: int, out: str) -> None:
    files = sorted(Path(work).glob("w*.pt"))[: n_cal + n_held]
    recs = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
    cal, held = stack_windows(recs[:n_cal], (512,)), stack_windows(recs[n_cal:], (512,))
    cands = (candidates_of(read_config(resolve_checkpoint("models/smollm2-draft")), "draft")
             + candidates_of(read_config(resolve_checkpoint("smollm2")), "target"))
    rows = []
    print("| max heads per group | K groups | heads | ARR (calibration) | ARR (held out) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for h in (1, 2, 3, 8):
        cfg = SearchConfig(512, 4, 64, max_heads=h)
        res = search_groups(cal, cands, cfg, [512], 4, single=greedy_search(cal, cands, cfg))
        for k, groups in res.tried.items():
            row = {"max_heads": h, "groups": k, "heads": sum(len(g.search.chosen) for g in groups),
                   "calibration": next(t["arr"] for t in res.trials if t["groups"] == k),
                   "heldout": groups_arr(held, cands, groups, 512, 4, 64),
                   "segments": [[g.start, g.stop] for g in groups]}
            rows.append(row)
            print(f"| {h} | {k} | {row['heads']} | {row['calibration']:.4f} | {row['heldout']:.4f} |", flush=True)
    Path(out).write_text(json.dumps({"rows": rows, "work": work, "calibration_windows": n_cal,
                                     "heldout_windows": n_held, **provenance()}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
