"""docs/cli.md is the typer app's own description, current with the code, and names every option
of every command; the CLI stays within its option budget; `--help`, `--version` and an argument
error answer without importing torch."""

import subprocess
import sys
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parents[2]


def _options(cmd) -> list[str]:
    own = [o for p in cmd.params if p.name != "help" for o in getattr(p, "opts", [])]
    return own + [o for sub in getattr(cmd, "commands", {}).values() for o in _options(sub)]


def test_docs_cli_md_is_current_and_names_every_option():
    from dustin.cli import app
    from dustin.docs import markdown

    text = markdown()
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == text, "run `make docs` (python -m dustin.docs)"
    options = _options(typer.main.get_command(app))
    assert len(options) > 100 and all(f"`{o}`" in text for o in options)


def test_option_budget():
    """All options of all commands together stay within 120 (one name each)."""
    from dustin.cli import app

    def count(cmd):
        return sum(type(p).__name__.endswith("Option") and p.name != "help" for p in cmd.params) + \
            sum(count(sub) for sub in getattr(cmd, "commands", {}).values())

    assert count(typer.main.get_command(app)) <= 120


CHECK = """
import sys
from dustin.cli import main
sys.argv = ["dustin", *{argv!r}]
try:
    main()
except SystemExit as e:
    print("exit", e.code, "torch" in sys.modules, file=sys.stderr)
"""


def test_help_version_and_argument_errors_do_not_import_torch():
    for argv, code in ((["--help"], 0), (["--version"], 0), (["eval", "pg19", "--windows", "0"], 2),
                       (["decode", "--bogus"], 2), (["bench", "e2e", "--help"], 0)):
        p = subprocess.run([sys.executable, "-c", CHECK.format(argv=argv)], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert p.stderr.strip().splitlines()[-1] == f"exit {code} False", (argv, p.stderr[-500:])
    version = subprocess.run([sys.executable, "-m", "dustin.cli", "--version"], capture_output=True, text=True,
                             timeout=120, cwd=ROOT).stdout
    assert version.startswith("dustin 0.") and "(" in version  # the commit in a checkout
