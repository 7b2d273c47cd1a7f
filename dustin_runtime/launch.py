"""The launcher's variables (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
LOCAL_WORLD_SIZE) checked before anything uses them, and a rendezvous that ends in seconds, not in
a silent 30-minute wait: every rank registers in rank 0's store and waits for all the others for
DUSTIN_RENDEZVOUS_TIMEOUT seconds (default 120); past it, one line names the ranks that never came."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from dustin_runtime.errors import DustinError, RankError

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets
DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Launch:
    rank: int
    world: int
    local_rank: int
    local_world: int
    addr: str
    port: int


def launched() -> bool:
    """Whether this process was started by torchrun (or a launcher setting the same variables)."""
    return all(v in os.environ for v in LAUNCH_VARS)


def _int(name: str, low: int, default: str | None = None) -> int:
    raw = os.environ.get(name, default)
    try:
        v = int(raw)
    except (TypeError, ValueError):
        v = None
    if v is None or v < low:
        raise DustinError(f"the launcher's {name}={raw!r} is not an integer >= {low} (torchrun sets it)")
    return v


def launch() -> Launch | None:
    """This process's place under the launcher, checked (None without one)."""
    if not launched():
        return None
    world, rank, local_rank = _int("WORLD_SIZE", 1), _int("RANK", 0), _int("LOCAL_RANK", 0)
    local_world = _int("LOCAL_WORLD_SIZE", 1, str(world))
    port = _int("MASTER_PORT", 1)
    if port > 65535:
        raise DustinError(f"the launcher's MASTER_PORT={port} is not a port (1-65535)")
    if rank >= world:
        raise DustinError(f"the launcher's RANK={rank} is not below WORLD_SIZE={world}")
    if local_rank >= local_world or local_world > world:
        raise DustinError(f"the launcher's LOCAL_RANK={local_rank} / LOCAL_WORLD_SIZE={local_world} do not fit "
                          f"WORLD_SIZE={world}")
    addr = os.environ["MASTER_ADDR"].strip()
    if not addr:
        raise DustinError("the launcher's MASTER_ADDR is empty")
    return Launch(rank, world, local_rank, local_world, addr, port)


def launch_rank() -> int:
    """This process's rank under a launcher (0 without one): only rank 0 prints and writes."""
    at = launch()
    return 0 if at is None else at.rank


def rendezvous_timeout() -> float:
    raw = os.environ.get("DUSTIN_RENDEZVOUS_TIMEOUT", str(DEFAULT_TIMEOUT))
    try:
        t = float(raw)
    except ValueError:
        t = -1.0
    if not 0 < t < 1e6:
        raise DustinError(f"DUSTIN_RENDEZVOUS_TIMEOUT={raw!r} is not a number of seconds > 0")
    return t


def _reach(at: Launch, where: str, timeout: float) -> None:
    """Wait for rank 0's store to listen (polled here: the store's own client logs a C++ stack)."""
    import socket

    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((at.addr, at.port), timeout=1).close()
            return
        except OSError as e:
            if time.monotonic() > end:
                raise RankError(f"rendezvous: rank {at.rank} cannot reach rank 0 at {where} within {timeout:g} s "
                                  f"({e.strerror or e}); set DUSTIN_RENDEZVOUS_TIMEOUT to wait longer") from None
            time.sleep(0.05)


def rendezvous(at: Launch):
    """Rank 0's TCP store with every rank registered in it (the store `init_process_group` then
    uses), or one line naming the ranks missing after the timeout."""
    from datetime import timedelta

    import torch.distributed as dist

    timeout = rendezvous_timeout()
    where = f"{at.addr}:{at.port}"
    if at.rank != 0:
        _reach(at, where, timeout)
    try:
        store = dist.TCPStore(at.addr, at.port, at.world, at.rank == 0, timedelta(seconds=timeout),
                              wait_for_workers=False)
    except (RuntimeError, OSError) as e:  # DistNetworkError and DistStoreError are RuntimeErrors
        who = "rank 0 cannot serve" if at.rank == 0 else f"rank {at.rank} cannot reach rank 0 at"
        raise RankError(f"rendezvous: {who} {where} within {timeout:g} s "
                          f"({' '.join(str(e).split())[:120]}); set DUSTIN_RENDEZVOUS_TIMEOUT to wait longer") from None
    store.set(f"dustin/rank{at.rank}", "1")
    keys, end = [f"dustin/rank{r}" for r in range(at.world)], time.monotonic() + timeout
    try:
        while missing := [r for r, k in enumerate(keys) if not store.check([k])]:  # polled: no c10d warnings
            if time.monotonic() > end:
                raise RankError(f"rendezvous at {where}: rank{'s' if len(missing) != 1 else ''} "
                                  f"{', '.join(map(str, missing))} of WORLD_SIZE={at.world} did not join within "
                                  f"{timeout:g} s (start one process per rank, or set DUSTIN_RENDEZVOUS_TIMEOUT)")
            time.sleep(0.02)
    except (RuntimeError, OSError):  # rank 0 gave up first (and named them)
        raise RankError(f"rendezvous at {where}: rank 0 gave up waiting for the other ranks") from None
    return store
