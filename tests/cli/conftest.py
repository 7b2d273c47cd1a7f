"""The `cli` fixture: runs `dustin ARGS` as a subprocess through a fork server (cli_server.py) that
has imported the CLI and its libraries once. DUSTIN_TEST_SUBPROCESS=1 runs every call as a plain
`python -m dustin.cli ARGS` instead (slower, same results: the fork server's check)."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVER = Path(__file__).with_name("cli_server.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Ran:
    """What one CLI call did (the fields of subprocess.CompletedProcess that tests read)."""

    returncode: int
    stdout: str
    stderr: str


def base_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", "TOKENIZERS_PARALLELISM": "false"}


class Cli:
    def __init__(self, cache: Path):
        self.env = {"DUSTIN_CACHE": str(cache)}
        self.plain = os.environ.get("DUSTIN_TEST_SUBPROCESS") == "1"
        self.proc = None

    def _server(self):
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env={**base_env(), "PYTHONPATH": str(REPO)}, cwd=REPO)
        return self.proc

    def __call__(self, *args, cwd=None, env=None, timeout=300) -> Ran:
        args = [str(a) for a in args]
        env = {**self.env, **(env or {})}
        cwd = str(cwd or REPO)
        if self.plain:
            p = subprocess.run([sys.executable, "-m", "dustin.cli", *args], capture_output=True, text=True,
                               timeout=timeout, cwd=cwd, env={**base_env(), **env})
            return Ran(p.returncode, p.stdout, p.stderr)
        server = self._server()
        server.stdin.write(json.dumps({"argv": args, "cwd": cwd, "env": env, "timeout": timeout}) + "\n")
        server.stdin.flush()
        answer = json.loads(server.stdout.readline())
        return Ran(answer["rc"], answer["stdout"], answer["stderr"])

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def cli(tmp_path_factory):
    """cli(*args, cwd=None, env=None, timeout=300) -> Ran(returncode, stdout, stderr) of `dustin ARGS`."""
    runner = Cli(tmp_path_factory.mktemp("dustin-cache"))
    yield runner
    runner.close()
