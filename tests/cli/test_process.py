"""The process around a command (`dustin.process`), with real processes: a closed pipe exits 141
quietly, a full stdout (/dev/full) is one line and exit 2, standard streams closed at start are
harmless, arguments that are not UTF-8 are one line and exit 2, and SIGTERM / SIGHUP end a run like
Ctrl-C (one line, exit 128 + n) with its records kept and its lock released, so a re-run resumes.
(Signals during `profile` and their re-run artifacts: test_faults_property.py.)"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import stderr_lines

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}:{REPO / 'kernels'}"}


def dustin(*args, stdout=subprocess.PIPE, **kw):
    """`python -m dustin.cli ARGS` as a plain subprocess (pipes, devices and signals need a real one)."""
    return subprocess.Popen([sys.executable, "-m", "dustin.cli", *map(os.fsencode, map(str, args))],
                            stdout=stdout, stderr=subprocess.PIPE, cwd=REPO, env=ENV, **kw)


def errors(err: bytes) -> list[str]:
    """stderr's lines without the progress lines a run prints when stderr is not a terminal."""
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    return stderr_lines(text)


@pytest.fixture(scope="module")
def decode_args(small_models, tmp_path_factory):
    """A decode of 40 prompts on the tiny pair: long enough output to fill a pipe's reader."""
    f = tmp_path_factory.mktemp("proc") / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"Once upon a time {i}"}) + "\n" for i in range(40)))
    return ["decode", "--target", small_models["target"], "--draft", small_models["draft"], "--prompts", f,
            "--max-new-tokens", "4"]


@pytest.mark.parametrize("what", ["help", "decode"])
def test_closed_pipe_exits_141_quietly(what, decode_args):
    p = dustin(*(["--help"] if what == "help" else decode_args))
    p.stdout.close()  # the reader is gone before the first write (`dustin ... | head -0`)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 141 and errors(err) == []


@pytest.mark.parametrize("what", ["version", "decode"])
def test_full_stdout_is_one_line_and_exit_2(what, decode_args):
    with open("/dev/full", "w") as full:
        p = dustin(*(["--version"] if what == "version" else decode_args), stdout=full)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 2
    (line,) = errors(err)
    assert "cannot write the output" in line and "No space left on device" in line


def test_closed_standard_streams_at_start(decode_args):
    """`dustin ... >&- <&-`: nothing reads stdout at import, files the run opens never become fd 1."""
    p = subprocess.run(["sh", "-c", 'exec "$@" >&- <&-', "sh", sys.executable, "-m", "dustin.cli",
                        *map(str, decode_args[:-4]), "--max-new-tokens", "2", "--prompt", "hi", "--json"],
                       stderr=subprocess.PIPE, cwd=REPO, env=ENV, timeout=120)
    assert p.returncode == 0 and errors(p.stderr) == []


def test_argv_not_utf8_is_one_line(small_models):
    p = dustin("decode", "--target", small_models["target"], "--prompt", b"caf\xe9".decode("utf-8", "surrogateescape"))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2
    (line,) = errors(err)
    assert "argument 4" in line and "is not UTF-8" in line


def _records(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_sighup_end_like_ctrl_c_and_the_rerun_resumes(sig, small_models, tmp_path, assert_one_line_error,
                                                             cli):
    """eval passkey appends one record per case: a signal after the first is one line, exit 128 + n,
    the records kept, the lock released (the re-run is not refused) and the re-run decodes only the rest."""
    out = tmp_path / "pk"
    args = ["eval", "passkey", "--target", small_models["target"], "--draft", small_models["draft"], "--contexts",
            "160,170,180,190", "--policy", "full", "--out-dir", out]  # x 5 depths: 20 records
    p = dustin(*args)
    recs = None
    end = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < end:
        found = list(out.glob("*.jsonl"))
        if found and _records(found[0]) >= 1:
            recs = found[0]
            break
        time.sleep(0.005)
    assert recs is not None, p.communicate()[1]
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig and errors(err) == [f"error: stopped by {signal.Signals(sig).name}"]
    done = _records(recs)
    assert done >= 1  # the lock file stays; its flock went with the process
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    assert _records(recs) == 20 and done < 20
