"""The last screen of `make demo` (scripts/demo.sh): what was profiled, tokens per step and speed of
plain, standard speculative and dustin decoding on this machine, and perplexity ratios with their
intervals, in at most 80 columns x 30 lines. It reads the demo's outputs in its folder:

    profile.json                   the demo's profile (`dustin profile`)
    decode-{plain,full,dustin}.json  each `dustin decode --json` record (the last line it prints)
    pg19/pg19-<context>.json       `dustin eval pg19` (policies at the committed profile's settings)

and writes the summary to summary.txt beside them. `python -m dustin_eval.demo FOLDER [PROFILE]`,
PROFILE being the profile the pg19 step read (its refresh layers are named)."""

from __future__ import annotations

import sys
from pathlib import Path

from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import atomic_write, read_json

WIDTH, HEIGHT = 80, 30
DECODES = (("plain", "plain decoding"), ("full", "standard speculative"), ("dustin", "dustin"))
GPU_LINE = ("CPU runs check correctness; speed is measured on GPU: `dustin bench e2e`, "
            "results/speed-7b-32k/")


def _read(path: Path, what: str) -> dict:
    doc = read_json(path, what)
    if not isinstance(doc, dict):
        raise DustinError(f"{path}: no {what} there (run `make demo`, which writes it)")
    return doc


def _profile_lines(p: dict) -> list[str]:
    base = p.get("arr_baselines", {})
    others = ", ".join(f"{k} {base[k]:.3f}" for k in ("streamingllm", "quest", "oracle") if k in base)
    return [f"profile  {len(p.get('target_heads', []))} target + {len(p.get('draft_heads', []))} draft retrieval "
            f"KV heads, m = {p.get('m', 0)}, budget S = {p.get('budget')}",
            f"         ARR {p.get('arr', float('nan')):.3f}" + (f" ({others})" if others else "")]


def _decode_lines(records: dict[str, dict]) -> list[str]:
    stats = {k: r["stats"] for k, r in records.items()}
    first = next(iter(stats.values()))
    prompt, new = sum(first["prompt_tokens"]), sum(first["new_tokens"])
    lines = [f"decode   {new} new tokens after a {prompt}-token prompt, gamma {first.get('gamma') or 4}"]
    plain = stats.get("plain", {}).get("tokens_per_s")
    for key, name in DECODES:
        if key not in stats:
            continue
        s = stats[key]
        speed = f"  {s['tokens_per_s'] / plain:.2f}x plain" if plain and key != "plain" else ""
        lines.append(f"  {name:<22}{s['tokens_per_s']:7.2f} tokens/s{s['mean_tokens_per_step']:6.2f} tokens/step"
                     + speed)
    return lines + [f"  {line}" for line in _wrap(GPU_LINE, WIDTH - 2)]


def _pg19_lines(doc: dict, refresh: list[int]) -> list[str]:
    rows = [r for r in doc.get("rows", []) if r.get("policy") != "full" and "ppl_ratio" in r]
    if not rows:
        return []
    context, windows = rows[0]["context"], max(r["windows"] for r in rows)
    lines = [f"perplexity / full attention's ({context}-token context, {windows} windows, 95% intervals)"]
    for r in rows:
        name = f"{r['policy']} S={r['budget']}"
        if r["policy"] == "dustin" and refresh:
            name += f" (refresh {','.join(map(str, refresh))})"
        lines.append(f"  {name:<32}{r['ppl_ratio']:.3f} [{r['ppl_ratio_lo']:.3f}, {r['ppl_ratio_hi']:.3f}]")
    return lines


def _wrap(text: str, width: int) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return out + [line] if line else out


def summary(folder: Path, pg19_profile: Path | None = None) -> list[str]:
    """The summary's lines (each <= 80 columns, <= 30 of them) from the demo's outputs in `folder`;
    `pg19_profile`: the profile the pg19 step's dustin read (its refresh layers are named)."""
    folder = Path(folder)
    refresh = _read(Path(pg19_profile), "profile").get("refresh_layers", []) if pg19_profile else []
    lines = ["dustin demo (SmolLM2-135M + models/smollm2-draft on this machine's CPU)"]
    lines += _profile_lines(_read(folder / "profile.json", "profile"))
    records = {k: _read(folder / f"decode-{k}.json", "decode record") for k, _ in DECODES}
    lines += _decode_lines(records)
    pg19 = sorted((folder / "pg19").glob("pg19-*.json"))
    if pg19:
        lines += _pg19_lines(_read(pg19[-1], "pg19 result"), refresh)
    where = f"full output: {folder}/*.log; tables: {folder}/profile.*, {folder}/pg19/*.md"
    lines.append(where if len(where) <= WIDTH else "full output: the *.log, profile.* and pg19/*.md beside summary.txt")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m dustin_eval.demo FOLDER [PROFILE]", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    try:
        lines = summary(folder, Path(argv[1]) if len(argv) > 1 else None)
        atomic_write(folder / "summary.txt", "\n".join(lines) + "\n")
    except DustinError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
