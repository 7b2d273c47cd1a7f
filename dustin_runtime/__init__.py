"""The online engine: models, KV cache, attention backends, sampling, decoding loops, tensor
parallelism; the sparse-verification method in `dustin_runtime.sparse`, file I/O in `dustin_runtime.io`."""

import os

# OpenMP threads that spin between parallel regions slow small CPU matmuls ~20x when the cores are
# shared; sleeping threads cost microseconds. Set here, before torch loads its OpenMP runtime, for
# every entry point (the CLI, the tests, the probes import dustin_runtime before torch).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
