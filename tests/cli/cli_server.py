"""A fork server for the CLI tests: imports the `dustin` CLI and the libraries its commands import
lazily (torch, transformers, pandas, ...) once, then runs each request in a forked child exactly as
`python -m dustin.cli ARGS` would (`dustin.cli.main()` with that argv, cwd and environment, its
stdout and stderr in files), and answers with the exit status and both outputs. A case then costs
its own work, not ~2.5 s of imports. The server itself never runs a torch op, so no thread pool
exists when it forks. A request whose env sets DUSTIN_FAULTS runs under the fault driver
(tests/faults_driver/sitecustomize.py), installed in its child.

Protocol: one JSON request per line on stdin ({"argv": [...], "cwd": str, "env": {...}, "timeout": s}),
one JSON answer per line on stdout ({"rc": int, "stdout": str, "stderr": str}); a child past its
timeout is killed (rc -9)."""

import json
import os
import signal
import sys
import tempfile
import time
import traceback

import dustin_runtime  # noqa: F401 (sets OMP_WAIT_POLICY before torch loads OpenMP)

# isort: split

import matplotlib  # noqa: E402
import pandas  # noqa: E402, F401
import pyarrow.parquet  # noqa: E402, F401
import rich.progress  # noqa: E402, F401
import rich.table  # noqa: E402, F401
import safetensors.torch  # noqa: E402, F401
import torch._dynamo  # noqa: E402, F401  (the first meta-device init imports it: 2 s)
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast  # noqa: E402, F401
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402, F401
from transformers.models.llama import modeling_llama  # noqa: E402, F401

import dustin.cli  # noqa: E402

# what the commands import lazily: warm once here (imports only; nothing runs)
import dustin_eval.acceptance  # noqa: E402, F401
import dustin_eval.generator  # noqa: E402, F401
import dustin_eval.longbench_runner  # noqa: E402, F401
import dustin_eval.passkey_eval  # noqa: E402, F401
import dustin_eval.pg19_eval  # noqa: E402, F401
import dustin_profile.plan  # noqa: E402, F401
import dustin_profile.plots  # noqa: E402, F401
import dustin_profile.run  # noqa: E402, F401

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402, F401

import dustin_profile.show  # noqa: E402, F401
import dustin_runtime.pipeline  # noqa: E402, F401
import dustin_runtime.sparse.policies  # noqa: E402, F401

transformers.logging.set_verbosity_error()


def child(req: dict, out, err) -> None:
    """In the forked child: redirect, run the CLI, exit with its status (never returns)."""
    code = 1
    try:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        os.chdir(req["cwd"])
        os.environ.update(req.get("env", {}))
        if os.environ.get("DUSTIN_FAULTS"):  # the fault driver, as its sitecustomize does in a fresh interpreter
            from tests.faults_driver.sitecustomize import install

            install()
        sys.argv = [dustin.cli.__file__, *req["argv"]]
        try:
            dustin.cli.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()  # what the interpreter prints for an uncaught exception
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def wait(pid: int, timeout: float) -> int:
    """The child's exit status; past `timeout` seconds it is killed (a hung case fails, it does not
    hang the suite)."""
    end = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def main() -> None:
    answers = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        req = json.loads(line)
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(req, out, err)
            rc = wait(pid, req.get("timeout", 600))
            out.seek(0)
            err.seek(0)
            answers.write(json.dumps({"rc": rc, "stdout": out.read(), "stderr": err.read()}) + "\n")
            answers.flush()


if __name__ == "__main__":
    main()
