"""The process around a `dustin` command: every way it can end is one line on stderr and a
conventional exit status, never a traceback.

- Bad input (`DustinError`, a usage error of the option parser) and a failing output device
  (`> /dev/full`, any other OSError that escapes): one line, exit 2.
- Ctrl-C: one line, exit 130; SIGTERM and SIGHUP the same way (records already appended stay,
  context managers release the output lock on the way out), exit 128 + n (143, 129).
- A closed pipe (`dustin decode | head -1`): the quiet exit 141 of a process killed by SIGPIPE,
  stdout sent to /dev/null first so that the interpreter's last flush cannot fail again.
- Standard streams closed at start (`>&-`): /dev/null takes their file descriptors, so no file the
  run opens becomes fd 1 or 2 and nothing writes into it by mistake.
- Arguments that are not UTF-8, or empty (`--out-dir ''`): one line, exit 2 (before anything else
  reads them).
Under a launcher, ranks other than 0 print nothing (their errors are rank 0's too)."""

from __future__ import annotations

import errno
import os
import signal
import sys

from dustin_runtime.errors import DustinError, RankError

EXIT_SIGPIPE = 128 + signal.SIGPIPE
_received: list[int] = []  # the terminating signal, when one arrived


class Stop(KeyboardInterrupt):
    """A terminating signal turned into the interrupt every command already handles."""


def _on_signal(signum, frame) -> None:
    if not _received:
        _received.append(signum)
        raise Stop(signum)


def _standard_streams() -> None:
    """/dev/null in place of a closed stdin, stdout or stderr (fds 0-2)."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))  # noqa: SIM115


def _quiet_stdout() -> None:
    """Send whatever stdout still holds to /dev/null (its reader is gone)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


EMPTY_OK = ("--alphas", "--prompt")  # '' skips the alpha sweep; an empty prompt has its own line


def _argv_error(argv: list[str]) -> str | None:
    """Arguments that are not UTF-8, or empty (`--out-dir ''` would write into the working folder,
    `--target ''` read it as a checkpoint)."""
    for i, a in enumerate(argv):
        try:
            a.encode("utf-8")
        except UnicodeEncodeError:
            shown = a.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            return f"argument {i} ({shown!r}) is not UTF-8; give names and text in UTF-8"
    for i, a in enumerate(argv):
        opt, eq, value = a.partition("=") if a.startswith("--") else (argv[i - 1] if i else "", "", a)
        if (eq or not a.startswith("--")) and not value.strip() and opt not in EMPTY_OK:
            if opt.startswith("--"):
                return f"{opt} is empty: give it a value, or leave {opt} out for its default"
            return f"argument {i + 1} is empty: give it a value"
    return None


def fail(message: str, code: int) -> None:
    """One line on stderr (newlines in a message folded), then exit with `code`; a
    multi-process run's group is left first unless interrupted (a rank may be inside a
    collective)."""
    from rich.text import Text

    from dustin.render import err_console

    line = " ".join(message.split())
    try:
        err_console.print(Text.assemble(("error: ", "bold red"), line), highlight=False, soft_wrap=True)
    except OSError:
        pass  # stderr gone too: the exit status says it
    if code < 128:
        leave()
    raise SystemExit(code)


def leave() -> None:
    """Leave the tensor-parallel process group, if this command joined one."""
    from dustin_runtime.tp import finish

    finish()


def _follow_rank0() -> None:
    from dustin_runtime.launch import launch_rank

    if launch_rank() != 0:
        from dustin.render import console, err_console

        console.quiet = err_console.quiet = True
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)


def _interrupted() -> None:
    if _received:
        name = signal.Signals(_received[0]).name
        fail(f"stopped by {name}", 128 + _received[0])
    fail("interrupted", 130)


def _ended_by(e: BaseException) -> None:
    """Exit for an exception that escaped the command: the matching line and status, or re-raise."""
    from dustin.render import err_console

    if isinstance(e, RankError):
        err_console.quiet = False
    if isinstance(e, DustinError):
        fail(str(e), 2)
    if isinstance(e, KeyboardInterrupt):
        _interrupted()
    if isinstance(e, OSError) and e.errno == errno.EPIPE:
        _quiet_stdout()
        raise SystemExit(EXIT_SIGPIPE)
    if isinstance(e, OSError):
        _quiet_stdout()  # what it still buffers would fail again at exit
        where = f" ({e.filename})" if e.filename else ""
        fail(f"cannot write the output{where}: {e.strerror or e}", 2)
    if hasattr(e, "format_message") and hasattr(e, "exit_code"):  # click usage errors (typer's vendored click)
        if type(e).__name__ == "NoArgsIsHelpError":  # `dustin` alone: the help, as click prints it
            e.show()
            raise SystemExit(2)
        fail(e.format_message(), 2)
    raise e


def run(app) -> None:
    """Run the typer `app` on sys.argv as the console script does, ending as the module docstring
    says (never returns)."""
    _standard_streams()
    bad = _argv_error(sys.argv[1:])
    if bad:
        fail(bad, 2)
    try:
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, _on_signal)
        _follow_rank0()
        code = app(standalone_mode=False)  # typer returns 130 for Ctrl-C, and the code of an Exit
        if code == 130:
            _interrupted()
        sys.stdout.flush()
    except SystemExit as e:  # typer and rich exit 1 on a closed pipe: the quiet 141 instead
        if e.code == 1 and isinstance(e.__context__, OSError) and e.__context__.errno == errno.EPIPE:
            _ended_by(e.__context__)
        raise
    except BaseException as e:  # noqa: BLE001 (each kind ends as _ended_by says)
        import typer

        if isinstance(e, (typer.Exit, typer.Abort)):  # raised outside the command
            code = getattr(e, "exit_code", 1)
        else:
            _ended_by(e)
    leave()
    raise SystemExit(code if isinstance(code, int) else 0)
