"""Installs the fault driver (`faults.install`) in a fresh interpreter that has this folder on
PYTHONPATH (Python imports `sitecustomize` at start-up); nothing happens without DUSTIN_FAULTS."""

import faults

faults.install()
