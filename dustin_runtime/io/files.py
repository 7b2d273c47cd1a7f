"""Crash-safe files: atomic writes (temp file in the same folder, flush, fsync, rename, fsync the
folder), the files of one artifact published together, durable appends of JSONL lines, a lock on
an output folder, and the resume key of a run.

A kill at any point leaves either the old file or the new one, never a torn one; the lock keeps two
runs off one output; the resume key refuses to mix records made with other settings.

In a multi-process (tensor-parallel) run only rank 0 writes (`share_outputs`): on the other ranks
locks, atomic writes and appends do nothing (writers get a private scratch path), and they read
the same resume state as rank 0: `check_resume_key` ends with a collective that every rank passes
after rank 0 has checked (or discarded) the records, and that raises rank 0's error everywhere."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dustin_runtime.errors import DustinError

TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp(\.[^.]+)?$")  # atomic_path's temp names
_UMASK = os.umask(0o022)
os.umask(_UMASK)
_SHARED: dict = {"rank": 0, "agree": None}  # set by `share_outputs` in a multi-process run
_GROUP: list[list[tuple[Path, Path]]] = []  # the renames `published_together` holds back (its block's)


def share_outputs(rank: int, agree) -> None:
    """Join a multi-process run as `rank`: ranks other than 0 write nothing; `agree(error or None)`
    is the collective that raises the same error on every rank (`TensorParallel.agree`)."""
    _SHARED.update(rank=rank, agree=agree)


def _writer() -> bool:
    return _SHARED["rank"] == 0


def fsync_dir(folder: str | Path) -> None:
    """Make a rename or a new file in `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_dir(folder: str | Path, what: str = "output folder") -> Path:
    """mkdir -p with one clear error (a file in the way, no permission)."""
    folder = Path(folder)
    if not _writer():
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DustinError(f"{folder}: cannot be the {what}: a file of that name exists") from None
    except OSError as e:
        raise DustinError(f"{folder}: cannot create the {what} ({e.strerror or e})") from None
    return folder


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path` for a writer that takes a file name (parquet, PNG, safetensors,
    torch.save); on success it is fsynced and renamed over `path`, on failure removed. The temp
    name is hidden and keeps the extension (writers such as matplotlib read the format from it)."""
    path = Path(path)
    if not _writer():  # rank > 0 of a multi-process run: a scratch file, discarded
        with tempfile.TemporaryDirectory(prefix="dustin-rank-") as scratch:
            yield Path(scratch) / f"scratch{path.suffix}"
        return
    make_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    except OSError as e:
        raise DustinError(f"{path.parent}: cannot write there ({e.strerror or e})") from None
    os.close(fd)
    tmp = Path(tmp)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; results get the usual mode
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if not _GROUP:
            os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        cause = write_failure(e, path.parent)
        if cause is not None:
            raise DustinError(f"cannot write {path}: {cause}") from None
        raise
    if _GROUP:
        _GROUP[0].append((tmp, path))
    else:
        fsync_dir(path.parent)


@contextlib.contextmanager
def published_together() -> Iterator[None]:
    """The files of one artifact (a result's JSON, CSV, Markdown and plot; a profile and its tables)
    written inside the block are published together when it ends: each is written and fsynced
    into its temp file as it comes (`atomic_path`, `move_into`) and renamed over its path only after
    the last one, with SIGINT / SIGTERM / SIGHUP held back meanwhile. A failure anywhere (a full
    disk, Ctrl-C) leaves every earlier file as it was and removes the temp files. Nested blocks
    join the outer one."""
    if _GROUP or not _writer():
        yield
        return
    pending: list[tuple[Path, Path]] = []
    _GROUP.append(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            if TEMP_NAME.match(tmp.name):  # a staged file moved in with `move_into` stays where it was
                tmp.unlink(missing_ok=True)
        raise
    finally:
        _GROUP.clear()
    with _signals_held():
        for i, (tmp, path) in enumerate(pending):
            try:
                os.replace(tmp, path)
            except OSError as e:
                for rest, _ in pending[i:]:
                    if TEMP_NAME.match(rest.name):
                        rest.unlink(missing_ok=True)
                raise DustinError(f"cannot write {path}: {write_failure(e)}") from None
    for folder in dict.fromkeys(path.parent for _, path in pending):
        fsync_dir(folder)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP recorded, not acted on, inside the block (a handful of renames);
    the first one is raised again after it, to the handlers of before."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is not None]
    before = {s: signal.signal(s, lambda n, _frame: caught.append(n)) for s in held}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if caught:
            signal.raise_signal(caught[0])


_TORCH_WRITE = re.compile(r"inline_container|PytorchStreamWriter|iostream error|file write failed")
_CLOSED = re.compile(r"I/O operation on closed file|write to closed file")


def write_failure(e: BaseException, folder: str | Path | None = None) -> str | None:
    """The cause, as one short phrase, when `e` is a writer's I/O failure: an OSError (pyarrow's and
    matplotlib's are), torch.save's RuntimeError (its C++ writer keeps no errno: a full file
    system under `folder` is named as such) or a ValueError about a closed file; None for
    anything else (a bug, Ctrl-C), which the caller re-raises."""
    if isinstance(e, OSError):
        return e.strerror or " ".join(str(e).split()) or type(e).__name__
    torch_io = isinstance(e, RuntimeError) and _TORCH_WRITE.search(str(e))
    if not (torch_io or isinstance(e, ValueError) and _CLOSED.search(str(e))):
        return None
    try:
        if folder is not None and os.statvfs(folder).f_bavail == 0:
            return os.strerror(errno.ENOSPC)
    except OSError:
        pass
    return "the writer failed (" + " ".join(str(e).split())[:160] + ")"


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` atomically and durably."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def move_into(src: str | Path, dst: str | Path) -> Path:
    """Publish a finished file: fsync it and rename it over `dst` (same file system), then fsync
    the folder (inside `published_together`, with the block's other files at its end)."""
    src, dst = Path(src), Path(dst)
    if not _writer():
        src.unlink(missing_ok=True)
        return dst
    try:
        with open(src, "rb+") as f:
            os.fsync(f.fileno())
        if not _GROUP:
            os.replace(src, dst)
    except OSError as e:
        raise DustinError(f"cannot write {dst}: {write_failure(e)}") from None
    if _GROUP:
        _GROUP[0].append((src, dst))
    else:
        fsync_dir(dst.parent)
    return dst


def append_line(path: str | Path, line: str) -> None:
    """Append one line (newline added) and fsync it; a kill can tear only this last line."""
    path = Path(path)
    if not _writer():
        return
    new = not path.exists()
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line.rstrip("\n") + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise DustinError(f"cannot write {path}: {write_failure(e)}") from None
    if new:
        fsync_dir(path.parent)


def read_json(path: str | Path, what: str = "JSON file"):
    """The JSON value in `path`, or None when the file is missing, empty or torn (a kill during
    a non-atomic write leaves those)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DustinError(f"{path}: unreadable {what} ({e})") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None


class FolderLock:
    """An exclusive `fcntl.flock` on `<folder>/<name>`, held while the run lasts; a second run on the
    same folder is refused with one line naming the holder's pid. Re-entrant within a process (the
    CLI locks before loading models, the harness it calls locks again). The kernel drops the lock
    when the process dies, so a killed run never leaves a stale lock."""

    _held: dict[str, tuple[int, int]] = {}  # lock file -> (fd, depth) of this process

    def __init__(self, folder: str | Path, name: str = ".dustin.lock"):
        self.path = make_dir(folder) / name
        self._key = str(self.path.resolve())

    def __enter__(self) -> FolderLock:
        if not _writer():  # rank 0 of a multi-process run holds the lock
            return self
        if self._key in self._held:
            fd, depth = self._held[self._key]
            self._held[self._key] = (fd, depth + 1)
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise DustinError(f"{self.path.parent}: cannot lock this output folder ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DustinError(f"{self.path.parent} is in use by another dustin run (pid {holder}); "
                                  "wait for it or choose another output") from None
            raise DustinError(f"{self.path}: cannot lock ({e.strerror or e})") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:
            os.close(fd)
            raise DustinError(f"cannot write {self.path}: {write_failure(e)}") from None
        self._held[self._key] = (fd, 1)
        for f in self.path.parent.iterdir():  # temp files of a killed atomic write: ours to remove now
            if TEMP_NAME.match(f.name) and f.is_file():
                f.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        if not _writer():
            return
        fd, depth = self._held[self._key]
        if depth > 1:
            self._held[self._key] = (fd, depth - 1)
            return
        del self._held[self._key]
        os.close(fd)  # releases the flock


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def input_hashes(paths) -> dict[str, str]:
    """{file name: sha256} of a run's input files (books, data files), for its resume key's
    "inputs": a file changed under the same name is refused on resume, naming it."""
    out = {}
    for p in paths:
        try:
            out[Path(p).name] = sha256_file(p)
        except OSError as e:
            raise DustinError(f"{p}: cannot read ({e.strerror or e})") from None
    return out


def _show(v) -> str:
    s = json.dumps(v, sort_keys=True, default=str)
    return s if len(s) <= 40 else s[:37] + "..."


_MERGED = ("runs", "inputs")  # the key's parts a later run may add to


def _differences(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(setting, old, new) for each differing leaf setting, nested ones as dotted paths; under
    "runs" (label -> settings of one policy run) and "inputs" (file name -> sha256) only names
    both hold are compared: a run may add policies, budgets or data files (and records made before
    inputs were hashed resume on their names)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if k == "inputs" and not prefix and a is None:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            if k in _MERGED and not prefix:
                a, b = ({x: d[x] for x in set(a) & set(b)} for d in (a, b))
            out += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append((f"{prefix}{k}", a, b))
    return out


def check_resume_key(path: str | Path, key: dict, records: tuple[Path, ...] = (), *, restart: bool = False,
                     where: str | None = None) -> None:
    """The resume check of a run whose records (files or folders) are `records`; `key` holds every
    setting that changes them (under "runs", label -> the settings of each policy run). The first
    run stores the key at `path` before any record; a later run resumes when no shared setting
    differs (new runs are added to the stored key) and is refused with one line naming the
    differing settings otherwise. `restart` deletes the records and stores the new key. Records
    without a readable key (an older dustin made them) are refused too: their settings are unknown.
    In a multi-process run every rank returns (or raises rank 0's error) after rank 0's check."""
    agree = _SHARED["agree"]
    if agree is None:
        return _check_resume_key(path, key, records, restart=restart, where=where)
    error = None
    if _writer():
        try:
            _check_resume_key(path, key, records, restart=restart, where=where)
        except DustinError as e:
            error = str(e)
    agree(error)


def tracked(paths: list[Path]) -> list[str]:
    """The files among `paths` (and inside the folders among them) that git tracks, where they lie
    in a git checkout (none elsewhere, or without git)."""
    import subprocess

    if not paths:
        return []
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *(str(p.resolve()) for p in paths)],
                             cwd=paths[0].resolve().parent, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [f for f in out.stdout.decode(errors="replace").split("\0") if f] if out.returncode == 0 else []


def _check_resume_key(path: str | Path, key: dict, records: tuple[Path, ...], *, restart: bool,
                      where: str | None) -> None:
    path = Path(path)
    where = where or str(path.parent)
    key = json.loads(json.dumps(key, default=str))  # compare as stored
    present = [p for p in records if p.exists()]
    if restart and present:
        kept = tracked(present + ([path] if path.exists() else []))
        if kept:
            raise DustinError(f"--restart would delete files git tracks in {where} ({kept[0]}); write to a "
                              "folder of your own instead (runs/ is git-ignored), or remove them with git")
    old = None if restart else read_json(path, "resume key")
    old = old if isinstance(old, dict) else None  # a key that is not an object is no key
    if old is None and present and not restart:
        raise DustinError(f"{where} holds records without a resume key ({present[0].name}; made by an older "
                          "dustin or half-written), so their settings are unknown; pass --restart to discard them")
    if old is not None:
        diff = _differences(old, key)
        changed = [(k.removeprefix("inputs."), a, b) for k, a, b in diff if k.startswith("inputs.")]
        if changed:
            name, a, b = changed[0]
            more = f" (and {len(changed) - 1} more files)" if len(changed) > 1 else ""
            raise DustinError(f"{where} holds records made from another {name}{more}: its content changed (sha256 "
                              f"{str(a)[:12]} -> {str(b)[:12]}); restore it, pass --restart to discard the records, "
                              "or choose another output")
        if diff:
            shown = "; ".join(f"{k}: {_show(a)} -> {_show(b)}" for k, a, b in diff[:4])
            more = f" (+{len(diff) - 4} more)" if len(diff) > 4 else ""
            raise DustinError(f"{where} holds records made with other settings ({shown}{more}); "
                              "pass --restart to discard them, or choose another output")
        for part in _MERGED:
            if isinstance(old.get(part), dict) and isinstance(key.get(part), dict):
                key[part] = {**old[part], **key[part]}
        if key == old:
            return
    else:
        for p in present:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
    atomic_write(path, json.dumps(key, indent=1, sort_keys=True) + "\n")
