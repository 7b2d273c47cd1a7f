"""A fault driver for the property test (tests/cli/test_faults_property.py): on PYTHONPATH of a
`dustin` subprocess (Python imports `sitecustomize` at start-up) or installed by the CLI fork
server's child (`install()`), it makes the disk under a folder "full" from one write call on.

Environment (nothing happens without DUSTIN_FAULTS):
- DUSTIN_FAULTS: "count" (only log the write calls) or "enospc@K" (the K-th call, from 0, and every
  later one fail as a full file system fails them);
- DUSTIN_FAULTS_ROOT: only writes to files below this folder count (the run's outputs);
- DUSTIN_FAULTS_LOG: a file that gets one line per counted call ("<index> <kind> <path>") and a
  "FIRED <index>" line when the fault fires, so the test can count calls and see that it fired.

Write calls, each as the real writer fails on ENOSPC: `write` of a file object opened for writing
(builtins.open, io.open, pathlib; PIL's PNG writer goes through it) writes half of its data and
raises OSError(ENOSPC); os.write / os.pwrite / os.fsync on such a file (not a folder) raise it; torch.save (its C++
writer keeps no errno) leaves a torn file and raises the RuntimeError torch raises; pyarrow's
parquet writer leaves a torn file and raises OSError(ENOSPC). No product code knows of this."""

from __future__ import annotations

import builtins
import errno
import importlib.abc
import importlib.util
import io
import os
import stat
import sys

_REAL = {"open": builtins.open, "write": os.write, "pwrite": os.pwrite, "fsync": os.fsync}
_STATE = {"calls": 0, "first": None, "root": None, "log": None}
_WRITING = set("wax+")


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _below_root(path) -> bool:
    try:
        p = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return p == _STATE["root"] or p.startswith(_STATE["root"] + os.sep)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def _log(line: str) -> None:
    with _REAL["open"](_STATE["log"], "a") as f:
        f.write(line + "\n")


def _call(kind: str, path) -> bool:
    """Count one write call to `path` (below the root); True when it must fail."""
    i = _STATE["calls"]
    _STATE["calls"] += 1
    _log(f"{i} {kind} {os.fsdecode(path)}")
    fail = _STATE["first"] is not None and i >= _STATE["first"]
    if fail:
        _log(f"FIRED {i}")
    return fail


class _Writing:
    """A file object opened for writing below the root: its writes are counted calls."""

    def __init__(self, f, path):
        self._f, self._path = f, path

    def write(self, data):
        if _call("write", self._path):
            if len(data) > 1:
                self._f.write(data[: len(data) // 2])  # what a full disk took before it refused
            raise _enospc()
        return self._f.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _open(file, mode="r", *args, **kwargs):
    f = _REAL["open"](file, mode, *args, **kwargs)
    path = _fd_path(file) if isinstance(file, int) else file
    if _WRITING & set(mode) and _below_root(path):
        return _Writing(f, path)
    return f


def _fd_call(kind: str, fd: int) -> bool:
    """A counted call on a regular file below the root (a folder's fsync only makes a rename durable)."""
    path = _fd_path(fd)
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    return regular and _below_root(path) and _call(kind, path)


def _write(fd, data):
    if _fd_call("os.write", fd):
        raise _enospc()
    return _REAL["write"](fd, data)


def _pwrite(fd, data, offset):
    if _fd_call("os.pwrite", fd):
        raise _enospc()
    return _REAL["pwrite"](fd, data, offset)


def _fsync(fd):
    fileno = fd if isinstance(fd, int) else fd.fileno()
    if _fd_call("os.fsync", fileno):
        raise _enospc()
    return _REAL["fsync"](fd)


def _torn(path) -> None:
    with _REAL["open"](path, "wb") as f:
        f.write(b"PK\x03\x04torn")


def _patch_torch(torch) -> None:
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)) and _below_root(f) and _call("torch.save", f):
            _torn(f)
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                               "file data/0: file write failed")
        return real(obj, f, *args, **kwargs)

    torch.save = save


def _patch_parquet(pq) -> None:
    real = pq.write_table

    def write_table(table, where, *args, **kwargs):
        if isinstance(where, (str, os.PathLike)) and _below_root(where) and _call("parquet", where):
            _torn(where)
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real(table, where, *args, **kwargs)

    pq.write_table = write_table


_LATER = {"torch": _patch_torch, "pyarrow.parquet": _patch_parquet}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patch torch and pyarrow.parquet as soon as the run imports them."""

    def find_spec(self, name, path=None, target=None):
        if name not in _LATER:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _LATER[name](module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Start faulting as the environment says (see the module docstring); idempotent."""
    spec = os.environ.get("DUSTIN_FAULTS")
    if not spec or _STATE["root"] is not None:
        return
    _STATE["root"] = os.path.realpath(os.environ["DUSTIN_FAULTS_ROOT"])
    _STATE["log"] = os.environ["DUSTIN_FAULTS_LOG"]
    if spec.startswith("enospc@"):
        _STATE["first"] = int(spec.removeprefix("enospc@"))
    elif spec != "count":
        raise SystemExit(f"DUSTIN_FAULTS={spec!r}: expected 'count' or 'enospc@K'")
    builtins.open = io.open = _open
    os.write, os.pwrite, os.fsync = _write, _pwrite, _fsync
    for name, patch in _LATER.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport())


install()
