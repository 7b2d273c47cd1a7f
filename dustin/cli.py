"""The `dustin` command: thin typer commands over the library packages.

This is the only module that wires `dustin_runtime`, `dustin_profile`, `dustin_eval` and
`dustin_kernels` together. Library errors (`DustinError`) become one red line and exit code 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from dustin_runtime.errors import DustinError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
profile_app = typer.Typer(no_args_is_help=True, help="Offline profiling (Algorithm 1) and profile artifacts.")
eval_app = typer.Typer(no_args_is_help=True, help="Quality evaluations: LongBench, PG-19, passkey, acceptance.")
bench_app = typer.Typer(no_args_is_help=True, help="GPU speed benchmarks.")
app.add_typer(profile_app, name="profile")
app.add_typer(eval_app, name="eval")
app.add_typer(bench_app, name="bench")

console = Console()
err_console = Console(stderr=True)


def main() -> None:
    """Entry point of the console script: runs the app, turning `DustinError` into one line."""
    try:
        app(standalone_mode=False)
    except DustinError as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors arrive here with standalone_mode=False
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
