"""`dustin_runtime.ops` is the one gateway to the kernels: no other module of the runtime, the
profiler, the evaluations or the CLI imports `dustin_kernels` (only the attention benchmark, which
times the kernels themselves); every name it serves resolves to the kernel package's object."""

import ast
from pathlib import Path

import pytest

from dustin_runtime.ops import _WHERE, kernels

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"dustin_runtime/ops.py", "dustin_eval/bench_attention.py"}


def _imports_kernels(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n == "dustin_kernels" or n.startswith("dustin_kernels.") for n in names):
            return True
    return False


def test_only_ops_imports_the_kernels():
    files = [p for pkg in ("dustin", "dustin_runtime", "dustin_profile", "dustin_eval") for p in (ROOT / pkg).rglob("*.py")]
    assert len(files) > 40
    offenders = sorted(str(p.relative_to(ROOT)) for p in files
                       if str(p.relative_to(ROOT)) not in ALLOWED and _imports_kernels(p))
    assert offenders == []
    assert _imports_kernels(ROOT / "dustin_runtime/ops.py")  # the check sees an import where there is one


def test_every_gateway_name_is_the_kernels_object():
    import importlib

    for name, module in _WHERE.items():
        assert getattr(kernels, name) is getattr(importlib.import_module(f"dustin_kernels.{module}"), name)
    with pytest.raises(AttributeError, match="no 'nope'"):
        kernels.nope  # noqa: B018
