"""A fork server for the tensor-parallel tests: imports torch, the runtime, the CLI and the cases
(`tp_cases.py`) once, then runs each request as `world` forked processes, one rank each, with the
variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
and one intra-op thread. A request runs either a case function `tp_cases.NAME(tp, **kwargs)` in a
gloo process group (its return value saved to `<dir>/rank<r>.pt`) or the CLI (`argv`: what
`torchrun -m dustin.cli ARGV` runs in each process). The server itself never runs a torch op, so
no thread pool exists when it forks.

Protocol: one JSON request per line on stdin ({"world": P, "dir": str, "case": str, "kwargs": {...}}
or {"world": P, "dir": str, "argv": [...], "cwd": str, "env": {...}}, plus "timeout": s), one JSON
answer per line on stdout ({"rc": [per rank]}); a rank's stdout and stderr are in
`<dir>/rank<r>.out` / `.err`. Ranks past the timeout are killed (rc -9)."""

import importlib.util
import json
import os
import signal
import socket
import sys
import time
import traceback

import dustin_runtime  # noqa: F401 (sets OMP_WAIT_POLICY before torch loads OpenMP)

# isort: split

import safetensors.torch  # noqa: E402, F401
import torch  # noqa: E402
import torch._dynamo  # noqa: E402, F401  (the first meta-device init imports it)
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402

import dustin.cli  # noqa: E402
import dustin_eval.acceptance  # noqa: E402, F401
import dustin_profile.plan  # noqa: E402, F401
import dustin_runtime.pipeline  # noqa: E402, F401
import dustin_runtime.sparse.policies  # noqa: E402, F401
from dustin_runtime.tp import TensorParallel  # noqa: E402

transformers.logging.set_verbosity_error()
_spec = importlib.util.spec_from_file_location("tp_cases", os.path.join(os.path.dirname(__file__), "tp_cases.py"))
tp_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp_cases)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child(req: dict, rank: int, port: int) -> None:
    """In a forked rank: redirect, join the group, run the case or the CLI, exit (never returns)."""
    code = 1
    try:
        out = open(os.path.join(req["dir"], f"rank{rank}.out"), "w")
        err = open(os.path.join(req["dir"], f"rank{rank}.err"), "w")
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        world = req["world"]
        os.environ.update(req.get("env", {}))
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        torch.set_num_threads(1)
        try:
            if "argv" in req:
                os.chdir(req["cwd"])
                sys.argv = [dustin.cli.__file__, *req["argv"]]
                dustin.cli.main()
                code = 0
            else:
                dist.init_process_group("gloo")
                res = getattr(tp_cases, req["case"])(TensorParallel(rank, world, None),
                                                     **req.get("kwargs", {}))
                torch.save(res, os.path.join(req["dir"], f"rank{rank}.pt"))
                dist.destroy_process_group()
                code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def run(req: dict) -> list[int]:
    port = free_port()
    pids = []
    for rank in range(req["world"]):
        pid = os.fork()
        if pid == 0:
            child(req, rank, port)
        pids.append(pid)
    deadline, codes = time.monotonic() + req.get("timeout", 120), {}
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = -9
        time.sleep(0.01)
    return [codes[p] for p in pids]


def main() -> None:
    for line in sys.stdin:
        req = json.loads(line)
        answer = {"rc": run(req)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
