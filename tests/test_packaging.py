"""The package as pip builds it: no warning from setuptools about pyproject.toml (the deprecated
license table, a package left out of the explicit list), and the wheel holds every file of the
source packages (modules and data), so an installed copy runs what the checkout does."""

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"dustin": "dustin", "dustin_runtime": "dustin_runtime", "dustin_profile": "dustin_profile",
         "dustin_eval": "dustin_eval", "dustin_kernels": "kernels/dustin_kernels"}  # installed name -> source


def test_wheel_builds_without_warnings_and_holds_every_source_file(tmp_path):
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)  # not the repo: no build/ or egg-info left beside the sources
    assert p.returncode == 0, p.stderr
    for word in ("Warning", "deprecat", "!!"):
        assert word.lower() not in (p.stdout + p.stderr).lower(), p.stdout + p.stderr
    (wheel,) = tmp_path.glob("dustin-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    wanted = {f"{name}/{f.relative_to(REPO / src).as_posix()}" for name, src in ROOTS.items()
              for f in (REPO / src).rglob("*") if f.is_file() and f.suffix in (".py", ".json")
              and "__pycache__" not in f.parts}
    assert wanted and not wanted - inside, sorted(wanted - inside)
