"""Result files: tables, score-vs-budget plot."""

import csv
import json

from dustin_eval.results import (
    markdown_table,
    plot_score_vs_budget,
    write_csv,
    write_markdown,
    write_result_json,
)
from dustin_runtime.io.provenance import provenance

PNG = b"\x89PNG\r\n\x1a\n"


def test_tables(tmp_path):
    rows = [
        {"policy": "dustin", "budget": 512, "score": 55.23},
        {"policy": "full", "budget": None, "score": 55.8, "note": "a|b"},
    ]
    assert markdown_table(rows) == (
        "| policy | budget | score | note |\n|---|---|---|---|\n"
        "| dustin | 512 | 55.23 |  |\n| full |  | 55.8 | a\\|b |\n"
    )
    write_csv(tmp_path / "t.csv", rows)
    with open(tmp_path / "t.csv") as f:
        assert list(csv.DictReader(f))[1] == {
            "policy": "full",
            "budget": "",
            "score": "55.8",
            "note": "a|b",
        }
    prov = provenance(models={"target": "t"})
    doc = json.loads(
        write_result_json(tmp_path / "r" / "t.json", rows, prov, benchmark="x").read_text()
    )
    assert doc["schema_version"] == 1 and doc["benchmark"] == "x" and doc["rows"] == rows
    md = write_markdown(
        tmp_path / "t.md", "Title", [("Scores", markdown_table(rows))], prov
    ).read_text()
    assert md.startswith("# Title\n") and "- command: `" in md and "## Scores" in md


def test_plot_score_vs_budget(tmp_path):
    rows = [
        {"policy": p, "budget": b, "score": s}
        for p, b, s in [
            ("dustin", 256, 50.0),
            ("dustin", 512, 54.0),
            ("dustin", 1024, 55.5),
            ("streaming", 256, 40.0),
            ("streaming", 1024, 47.0),
            ("full", None, 55.8),
        ]
    ]
    path = plot_score_vs_budget(rows, tmp_path / "plots" / "longbench.png", title="LongBench")
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 5000
