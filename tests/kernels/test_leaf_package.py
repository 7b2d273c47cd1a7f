"""`dustin_kernels` is a leaf: importing it (and every kernel module) loads no other dustin package."""

import subprocess
import sys

CHECK = """
import importlib, pkgutil, sys
import dustin_kernels
for m in pkgutil.iter_modules(dustin_kernels.__path__):
    importlib.import_module("dustin_kernels." + m.name)
print(" ".join(sorted(n for n in sys.modules if n.split(".")[0] in {"dustin", "dustin_runtime", "dustin_eval", "dustin_profile"})))
"""


def test_importing_the_kernels_loads_no_dustin_package():
    p = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "", f"dustin_kernels imported {p.stdout.strip()}"

