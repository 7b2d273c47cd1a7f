"""Table of results/draft-vocab: tokens per step of full verification with the draft's LM head over
the K most frequent tokens (`--draft-vocab`) against the whole head, on the same windows, with the
95% bootstrap interval over windows of `dustin eval acceptance`'s retention (`dustin_eval.acceptance.
intervals`); and whether greedy decoding emitted the same tokens (it must: the target decides).
`python probes/draft_vocab_table.py results/draft-vocab` prints markdown."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dustin_eval.acceptance import intervals


def main(folder: str) -> None:
    runs = {}
    for f in sorted(Path(folder).glob("k-*.runs.jsonl")):
        k = f.name.removeprefix("k-").removesuffix(".runs.jsonl")
        runs[k] = {r["context"]: r for r in map(json.loads, f.read_text().splitlines()) if r.get("policy") == "full"}
    base = runs.pop("none")
    print("| head tokens K | context | tau (tokens / step) | whole head's tau | retention [95% interval] | same tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k in sorted(runs, key=int, reverse=True):
        for ctx, r in sorted(runs[k].items()):
            full = base[ctx]
            ci = intervals(r, full)["retention_ci"]
            ret = (sum(r["tokens_per_sequence"]) / sum(r["steps_per_sequence"])) / (
                sum(full["tokens_per_sequence"]) / sum(full["steps_per_sequence"]))
            same = r["tokens"] == full["tokens"]
            print(f"| {k} | {ctx} | {r['tau']:.3f} | {full['tau']:.3f} | {ret:.1%} [{ci[0]:.1%}, {ci[1]:.1%}] | "
                  f"{'yes' if same else 'no'} |")


if __name__ == "__main__":
    main(sys.argv[1])
