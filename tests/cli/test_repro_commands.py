"""Every `dustin.cli` command the Makefile and scripts/ run names a command and options that exist:
a renamed or removed option breaks a repro target only when someone runs it, so this reads them all."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from dustin.cli import app

REPO = Path(__file__).resolve().parents[2]
FILES = [REPO / "Makefile", *sorted((REPO / "scripts").rglob("*.sh"))]


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined; Make variables `NAME = ...` expanded in place."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    vars_ = {m.group(1): m.group(2) for m in (re.match(r"^([A-Z_][A-Z0-9_]*)\s*[?:]?=\s*(.*)$", ln) for ln in lines) if m}
    out = []
    for ln in lines:
        for _ in range(3):
            ln = re.sub(r"\$\(([A-Z_][A-Z0-9_]*)\)", lambda m: vars_.get(m.group(1), m.group(0)), ln)
        out.append(ln)
    return out


def _invocations() -> list[tuple[str, list[str]]]:
    found = []
    for f in FILES:
        for ln in _logical_lines(f.read_text()):
            m = re.search(r"-m dustin\.cli\s+(.*)$", ln) or (f.suffix == ".sh" and re.search(r"^\s*dustin\s+(\w.*)$", ln))
            if not m or ln.lstrip().startswith("#"):
                continue
            rest = m.group(1).split(";")[0].split("|")[0].split("&&")[0].split(">")[0]
            try:
                words = shlex.split(rest, comments=True)
            except ValueError:
                words = rest.split()
            if not words or words[0].startswith("$"):
                continue  # a shell function forwarding "$@"
            found.append((f"{f.relative_to(REPO)}: {ln.strip()[:80]}", words))
    return found


def _resolve(words: list[str]):
    cmd = typer.main.get_command(app)
    path = []
    while getattr(cmd, "commands", None) and words and words[0] in cmd.commands:
        path.append(words[0])
        cmd = cmd.commands[words.pop(0)]
    return " ".join(path), cmd


INVOCATIONS = _invocations()


def test_the_repro_files_run_the_cli():
    assert len(INVOCATIONS) >= 10, INVOCATIONS  # the Makefile's targets are found at all


@pytest.mark.parametrize("where,words", INVOCATIONS, ids=[w for w, _ in INVOCATIONS])
def test_repro_command_options_exist(where, words):
    path, cmd = _resolve(list(words))
    runs_itself = not getattr(cmd, "commands", None) or any(p.name != "help" for p in cmd.params)
    assert path and runs_itself, f"{where}: no such command {' '.join(words[:2])!r}"
    known = {o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))}
    used = {w.split("=")[0] for w in words if w.startswith("--")}
    assert not used - known, f"{where}: {path} has no {sorted(used - known)}"


def test_repro_72b_runs_the_pipeline_at_4_ranks():
    """`make repro-72b`: profile -> LongBench at S = 512 -> PG-19 -> bench e2e, each at --tp 4 under
    the launcher's 4 processes, each writing into results/ and the evals reading the profile it made."""
    lines = _logical_lines((REPO / "Makefile").read_text())
    start = lines.index("repro-72b: .stamp-install")
    recipe = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        recipe.append(shlex.split(ln.split("-m dustin.cli", 1)[1]))
        assert "--nproc-per-node 4 -m dustin.cli" in ln, ln
    assert [w[:2] if w[0] != "profile" else w[:1] for w in recipe] == [["profile"], ["eval", "longbench"],
                                                                        ["eval", "pg19"], ["bench", "e2e"]]
    opts = [dict(zip(w[::1], w[1:], strict=False)) for w in recipe]
    assert all(o.get("--tp") == "4" for o in opts)
    made = opts[0]["--out"]
    assert made.startswith("results/") and all(o["--profile"] == made for o in opts[1:3])
    assert all(o["--out-dir"].startswith("results/") for o in opts[1:]) and opts[1]["--budget"] == "512"
    assert len({o["--target"] for o in opts}) == 1 and "$" not in opts[0]["--target"]
