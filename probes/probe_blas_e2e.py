"""Probe: the decoding phases' torch GEMMs through cuBLASLt (`dustin_runtime.engine.BLAS`, the default)
against cuBLAS's own heuristic, end to end in `dustin bench e2e`'s loop (random weights at the preset
shapes, one process, interleaved rounds). Why: probes/probe_verify_gemm.py (w2 at 80 rows 37.1 vs 42.8 us).

    python probes/probe_blas_e2e.py [policies] [batch] [context] [rounds] -> $OUT/probe-blas-e2e.json"""

from __future__ import annotations

import sys

from common import e2e_arms

from dustin_runtime import engine


def arm(name: str) -> None:
    engine.BLAS = None if name == "cublas" else name


def main(policies: str = "ar,full,dustin-vs", batch: str = "16", context: str = "32768", rounds: str = "2") -> None:
    e2e_arms(policies, batch, context, rounds, ("cublas", "cublaslt"), arm, "cublaslt", "probe-blas-e2e.json")


if __name__ == "__main__":
    main(*sys.argv[1:])
