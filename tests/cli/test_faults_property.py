"""Seeded random faults of the world around a run, over the commands that write artifacts
(`profile`, `eval pg19`, `eval acceptance` on the tiny pair): a full disk from a random write call on
(the driver tests/faults_driver/sitecustomize.py patches the writers' low-level writes; no product
code knows of it), stdout closed or full, and SIGTERM / SIGHUP / SIGINT at a random moment of the
run. Each case starts from the artifact of an earlier, smaller run in its folder and asserts: the
conventional exit status, at most one stderr line and no traceback, the earlier artifact intact
(its files byte-identical, its records a prefix of the new ones), and that a re-run without the
fault gives the artifact of the uninterrupted run from the same start."""

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import assert_same_profile, stderr_lines, timeless, write_books

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "faults_driver"


def _profile(d, root, windows):
    return ["profile", "--target", d["T"], "--draft", d["D"], "--calib", d["books"], "--context", "96", "--windows",
            windows, "--budget", "48", "--sinks", "4", "--window", "8", "--max-heads", "2", "--out", root / "p.json"]


def _pg19(d, root, budgets):
    return ["eval", "pg19", "--data", d["books"], "--target", d["T"], "--draft", d["D"], "--context", "96",
            "--eval-tokens", "8", "--windows", "2", "--policy", "full,streamingllm", "--budget", budgets,
            "--out-dir", root]


def _acceptance(d, root, policies):
    return ["eval", "acceptance", "--data", d["books"], "--target", d["T"], "--draft", d["D"], "--contexts", "128",
            "--windows", "1", "--max-new-tokens", "3", "--budget", "80", "--policy", policies, "--out", root / "x"]


# command -> (args of the earlier run, args of the run under faults, its published files, its records)
COMMANDS = {
    "profile": (lambda d, r: _profile(d, r, 1), lambda d, r: _profile(d, r, 2), ("p.json", "p.*.parquet", "p.*.png"),
                ()),
    "pg19": (lambda d, r: _pg19(d, r, "80"), lambda d, r: _pg19(d, r, "80,88"), ("pg19-96.*",), ("records-96.jsonl",)),
    "acceptance": (lambda d, r: _acceptance(d, r, "full"), lambda d, r: _acceptance(d, r, "full,streamingllm"),
                   ("x.json", "x.md"), ("x.runs.jsonl",)),
}


def published(cmd: str, root: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for pattern in COMMANDS[cmd][2] for f in sorted(root.glob(pattern))}


def records(cmd: str, root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in COMMANDS[cmd][3] if (root / name).exists()}


def _lines(data: bytes) -> list:
    return sorted(json.dumps(timeless(json.loads(x)), sort_keys=True) for x in data.decode().splitlines())


def assert_same_artifact(cmd: str, got: Path, want: Path) -> None:
    """The artifact in `got` equals the one in `want` (profile: `assert_same_profile`; evals: the result
    JSON and records without timing and provenance, plots and CSV byte for byte)."""
    if cmd == "profile":
        return assert_same_profile(got / "p.json", want / "p.json")
    g, w = published(cmd, got), published(cmd, want)
    assert g.keys() == w.keys()
    for name in w:
        if name.endswith(".json"):
            assert timeless(json.loads(g[name])) == timeless(json.loads(w[name])), name
        elif not name.endswith(".md"):  # the markdown repeats the JSON's rows and its provenance
            assert g[name] == w[name], name
    g, w = records(cmd, got), records(cmd, want)
    assert g.keys() == w.keys() and all(_lines(g[n]) == _lines(w[n]) for n in w)


@pytest.fixture(scope="module")
def data(tmp_path_factory, small_models):
    root = tmp_path_factory.mktemp("faults")
    books = write_books(root / "books", 2, 80, random.Random(0))
    return {"root": root, "books": books, "T": small_models["target"], "D": small_models["draft"]}


def fault_env(root: Path, log: Path, spec: str) -> dict:
    return {"DUSTIN_FAULTS": spec, "DUSTIN_FAULTS_ROOT": str(root), "DUSTIN_FAULTS_LOG": str(log),
            "PYTHONPATH": os.pathsep.join(map(str, (DRIVER, REPO, REPO / "kernels")))}


@pytest.fixture(scope="module")
def start(cli, data):
    """start(cmd) -> (template, ref, calls, seconds): the folder an earlier, smaller run left, the same
    after the command ran uninterrupted from it, the write calls that run made (driver's count) and
    its duration; made once per command."""
    made = {}

    def get(cmd: str):
        if cmd not in made:
            earlier, full = COMMANDS[cmd][:2]
            template, ref = data["root"] / f"{cmd}-template", data["root"] / f"{cmd}-ref"
            p = cli(*earlier(data, template))
            assert p.returncode == 0, p.stderr
            shutil.copytree(template, ref)
            log = data["root"] / f"{cmd}-count.log"
            t0 = time.monotonic()
            p = cli(*full(data, ref), env=fault_env(ref, log, "count"))
            assert p.returncode == 0, p.stderr
            calls = log.read_text().splitlines()
            assert calls and not any(x.startswith("FIRED") for x in calls)
            made[cmd] = template, ref, len(calls), time.monotonic() - t0
        return made[cmd]

    return get


def case_folder(template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "out"
    shutil.copytree(template, root)
    return root


def assert_earlier_intact(cmd: str, root: Path, before: dict, before_records: dict) -> None:
    assert published(cmd, root) == before  # byte for byte
    now = records(cmd, root)
    for name, data in before_records.items():
        assert now[name].startswith(data), name  # appended to, never rewritten
    assert not [f for f in root.rglob(".*") if f.is_file() and not f.name.endswith(".lock")]  # no temp file left


ENOSPC = [("profile", 1), ("profile", 2), ("profile", 3), ("profile", 4), ("pg19", 5), ("pg19", 6), ("pg19", 7),
          ("acceptance", 8), ("acceptance", 9), ("acceptance", 10)]


@pytest.mark.parametrize(("cmd", "seed"), ENOSPC)
def test_disk_full_at_a_random_write(cmd, seed, cli, data, start, tmp_path):
    template, ref, calls, _ = start(cmd)
    root = case_folder(template, tmp_path)
    before, before_records = published(cmd, root), records(cmd, root)
    k = random.Random(seed).randrange(calls)
    log = tmp_path / "faults.log"
    p = cli(*COMMANDS[cmd][1](data, root), env=fault_env(root, log, f"enospc@{k}"))
    fired = [x for x in log.read_text().splitlines() if x.startswith(f"{k} ")]
    assert fired and f"FIRED {k}" in log.read_text(), f"call {k} of {calls} never came"
    where = f"{cmd}, full disk from call {k} of {calls} ({fired[0]})"
    assert "Traceback" not in p.stderr + p.stdout, (where, p.stderr)
    assert p.returncode == 2, (where, p.returncode, p.stderr)
    (line,) = stderr_lines(p.stderr)
    assert line.startswith("error: ") and ("No space left on device" in line or "writer failed" in line), (where, line)
    assert_earlier_intact(cmd, root, before, before_records)
    again = cli(*COMMANDS[cmd][1](data, root))
    assert again.returncode == 0, (where, again.stderr)
    assert_same_artifact(cmd, root, ref)
