"""dustin_runtime.io.files: atomic writes leave the old file or the new one, the files of one
artifact are published together, appends survive a torn line, the folder lock refuses another
process, and resume keys refuse other settings."""

import json
import os
import subprocess
import sys

import pytest

from dustin_eval.jsonl import append_jsonl, read_jsonl, repair_jsonl
from dustin_runtime.errors import DustinError
from dustin_runtime.io.files import (
    FolderLock,
    atomic_path,
    atomic_write,
    check_resume_key,
    input_hashes,
    move_into,
    published_together,
)


def test_atomic_write_replaces_or_keeps(tmp_path):
    path = tmp_path / "sub" / "r.json"
    atomic_write(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temp file left
    atomic_write(path, b"new")
    assert path.read_text() == "new"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not the temp file's private mode
    with atomic_path(tmp_path / "plot.png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path  # writers read the format from the name


def test_files_published_together_are_all_new_or_all_old(tmp_path):
    paths = [tmp_path / n for n in ("r.json", "r.md", "r.png")]
    for p in paths:
        atomic_write(p, "old")
    staged = tmp_path / "work" / "r.png"
    staged.parent.mkdir()
    with pytest.raises(OSError, match="No space left"):
        with published_together():
            atomic_write(paths[0], "new")
            with published_together():  # nested: joins the outer block
                atomic_write(paths[1], "new")
            staged.write_text("new")
            move_into(staged, paths[2])
            assert [p.read_text() for p in paths] == ["old"] * 3  # nothing renamed yet
            raise OSError(28, "No space left on device")  # the next writer's failure
    assert [p.read_text() for p in paths] == ["old"] * 3
    assert staged.read_text() == "new"  # a staged file is left where it was (a re-run publishes it)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.md", "r.png", "work"]  # no temp file
    with published_together():
        atomic_write(paths[0], "new")
        atomic_write(paths[1], "new")
        move_into(staged, paths[2])
    assert [p.read_text() for p in paths] == ["new"] * 3 and not staged.exists()


def test_a_signal_while_publishing_comes_after_the_renames(tmp_path, monkeypatch):
    import signal

    seen = []
    old = signal.signal(signal.SIGHUP, lambda n, f: seen.append((tmp_path / "b.txt").exists()))
    real = os.replace

    def replace(a, b):  # SIGHUP arrives between the two renames
        real(a, b)
        if (tmp_path / "a.txt").exists() and not (tmp_path / "b.txt").exists():
            signal.raise_signal(signal.SIGHUP)

    try:
        monkeypatch.setattr(os, "replace", replace)
        with published_together():
            atomic_write(tmp_path / "a.txt", "new")
            atomic_write(tmp_path / "b.txt", "new")
    finally:
        signal.signal(signal.SIGHUP, old)
    assert seen == [True]  # handled once both were published


def test_write_into_a_file_is_one_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(DustinError, match="a file of that name exists"):
        atomic_write(tmp_path / "f" / "r.json", "x")


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "r.jsonl"
    append_jsonl(path, {"a": 1})
    append_jsonl(path, {"b": "é"})
    with open(path, "ab") as f:
        f.write('{"c": "é'.encode()[:-1])  # a kill in the middle of a line, even of a character
    assert read_jsonl(path) == [{"a": 1}, {"b": "é"}]
    assert repair_jsonl(path) == [{"a": 1}, {"b": "é"}]
    append_jsonl(path, {"d": 4})
    assert read_jsonl(path) == [{"a": 1}, {"b": "é"}, {"d": 4}]
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(DustinError, match="r.jsonl:2: not a JSON line"):
        read_jsonl(path)


def test_folder_lock_refuses_another_process_and_nests(tmp_path):
    probe = ("import sys; from dustin_runtime.io.files import FolderLock\n"
             "try:\n    FolderLock(sys.argv[1]).__enter__(); print('locked')\n"
             "except Exception as e:\n    print(e)")
    (tmp_path / "out").mkdir()
    stale = tmp_path / "out" / ".r.json.abcd1234.tmp.json"  # left by a kill during an atomic write
    stale.write_text("{")
    with FolderLock(tmp_path / "out"):
        assert not stale.exists()
        with FolderLock(tmp_path / "out"):  # the CLI locks, then the harness it calls
            pass
        p = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "out")], capture_output=True, text=True)
        assert f"is in use by another dustin run (pid {os.getpid()})" in p.stdout, p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "out")], capture_output=True, text=True)
    assert p.stdout.strip() == "locked"  # released on exit


def test_resume_key_refuses_other_settings_and_restart_discards(tmp_path):
    key_path, records = tmp_path / "k.json", tmp_path / "r.jsonl"
    key = {"gamma": 4, "models": {"target": "t"}, "runs": {"full": {"policy": "full"}}}
    check_resume_key(key_path, key, (records,))
    records.write_text('{"x": 1}\n')
    check_resume_key(key_path, key, (records,))  # same settings: resume
    more = {**key, "runs": {**key["runs"], "dustin@64": {"window": 8}}}
    check_resume_key(key_path, more, (records,))  # a new run is added, not a difference
    assert set(json.loads(key_path.read_text())["runs"]) == {"full", "dustin@64"}
    other = {**more, "runs": {"dustin@64": {"window": 16}}, "models": {"target": "u"}}
    with pytest.raises(DustinError, match=r"other settings \(models.target: \"t\" -> \"u\"; "
                                          r"runs.dustin@64.window: 8 -> 16\).*--restart"):
        check_resume_key(key_path, other, (records,))
    assert records.exists()
    check_resume_key(key_path, other, (records,), restart=True)
    assert not records.exists() and json.loads(key_path.read_text())["models"] == {"target": "u"}


def test_resume_key_inputs_are_compared_by_content_and_added_to(tmp_path):
    key_path, records = tmp_path / "k.json", tmp_path / "r.jsonl"
    books = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for b in books:
        b.write_text(f"the text of {b.name}\n")
    check_resume_key(key_path, {"gamma": 4}, (records,))  # a key made before inputs were hashed
    records.write_text('{"x": 1}\n')
    check_resume_key(key_path, {"gamma": 4, "inputs": input_hashes(books[:1])}, (records,))  # resumes, hashed now
    check_resume_key(key_path, {"gamma": 4, "inputs": input_hashes(books)}, (records,))  # another file: added
    assert set(json.loads(key_path.read_text())["inputs"]) == {"a.txt", "b.txt"}
    books[1].write_text("the text of b.txx\n")  # one byte
    with pytest.raises(DustinError, match=r"made from another b.txt: its content changed.*--restart"):
        check_resume_key(key_path, {"gamma": 4, "inputs": input_hashes(books[1:])}, (records,))
    assert records.exists()


def test_records_without_a_key_are_refused(tmp_path):
    records = tmp_path / "r.jsonl"
    records.write_text('{"x": 1}\n')
    (tmp_path / "k.json").write_text("")  # torn by a kill (an older dustin wrote it in place)
    with pytest.raises(DustinError, match="records without a resume key.*--restart"):
        check_resume_key(tmp_path / "k.json", {"a": 1}, (records,))
    check_resume_key(tmp_path / "k.json", {"a": 1}, (records,), restart=True)
    assert not records.exists()


def test_torn_key_without_records_starts_afresh(tmp_path):
    (tmp_path / "meta.json").write_text("")  # a kill during an (older, in-place) write of the key
    check_resume_key(tmp_path / "meta.json", {"a": 1}, (tmp_path / "w000.pt",))
    assert json.loads((tmp_path / "meta.json").read_text()) == {"a": 1}


def test_restart_never_deletes_files_git_tracks(tmp_path):
    """In a git checkout, --restart refuses (one line naming the folder) to delete records git
    tracks, and still discards untracked ones."""
    import subprocess

    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    records = repo / "results" / "records.jsonl"
    key_path = repo / "results" / "key.json"
    check_resume_key(key_path, {"a": 1}, (records,))
    records.write_text('{"a": 1}\n')
    subprocess.run(["git", "-C", str(repo), "add", "results"], check=True)
    with pytest.raises(DustinError) as e:
        check_resume_key(key_path, {"a": 2}, (records,), restart=True, where="results")
    assert "git tracks in results" in str(e.value) and "\n" not in str(e.value)
    assert records.read_text() == '{"a": 1}\n'  # nothing deleted
    scratch = repo / "runs" / "records.jsonl"  # not tracked: discarded as before
    scratch.parent.mkdir()
    check_resume_key(repo / "runs" / "key.json", {"a": 1}, (scratch,))
    scratch.write_text("x\n")
    check_resume_key(repo / "runs" / "key.json", {"a": 2}, (scratch,), restart=True)
    assert not scratch.exists()


@pytest.mark.parametrize("writer", ["bytes", "torch", "parquet", "png"])
def test_a_full_disk_is_one_error_and_keeps_the_old_file(tmp_path, monkeypatch, writer):
    """Every writer's failure on a full device (the temp file made a link to /dev/full) is one
    DustinError naming the file; the old file stays, no temp file is left."""
    import tempfile

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = tmp_path / f"r.{ {'bytes': 'json', 'torch': 'pt', 'parquet': 'parquet', 'png': 'png'}[writer]}"
    atomic_write(path, "old")
    real = tempfile.mkstemp

    def full(*a, **k):
        fd, name = real(*a, **k)
        os.unlink(name)
        os.symlink("/dev/full", name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", full)
    with pytest.raises(DustinError, match=f"cannot write {path}: "):
        with atomic_path(path) as tmp:
            if writer == "bytes":
                tmp.write_bytes(b"x" * 100_000)
            elif writer == "torch":
                import torch

                torch.save({"a": torch.zeros(100_000)}, tmp)
            elif writer == "parquet":
                import pyarrow as pa
                import pyarrow.parquet as pq

                pq.write_table(pa.table({"a": list(range(100_000))}), tmp)
            else:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt

                fig = plt.figure()
                fig.savefig(tmp)
                plt.close(fig)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
