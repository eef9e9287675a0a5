"""The ``rankcollapse`` command line: a thin layer over the Python API.

Each sub-command lives in its own module exposing ``register(app)``; those modules
import torch, transformers, pandas and the numerical packages only inside their commands,
so ``--help``, ``--version`` and ``mask describe`` start without them
(``benchmarks/bench_startup.py`` measures it). Every error
below a command (the user's ``RankCollapseError``, an operating-system error, any
other) prints one line and exits with status 2 (see :mod:`._boundary`); only a real
interrupt exits with 130.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Sequence

import typer
from ._click import ClickException, NoArgsIsHelpError

from ._boundary import PREFIX, CliError, Group, describe

app = typer.Typer(
    name="rankcollapse",
    help="Measure, simulate and explain rank collapse in transformer self-attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Group,
)

def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"rankcollapse {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    pass


_SUBCOMMAND_MODULES = ("mask", "metrics", "simulate", "theory", "probe", "reproduce", "phase")

for _name in _SUBCOMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_name}").register(app)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); return the exit status.

    Errors print one line on stderr: status 2 for every error, 130 for a real
    interrupt (Ctrl-C), 0 on success.
    """
    try:
        rv = app(args=None if argv is None else list(argv), standalone_mode=False)
        if rv == 130:  # typer turns a KeyboardInterrupt into exit status 130
            print("rankcollapse: interrupted; rerun the same command to resume", file=sys.stderr)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt) or exc.__cause__ is None:
            print("rankcollapse: interrupted; rerun the same command to resume", file=sys.stderr)
            return 130
        return _fail_line(describe(exc.__cause__))  # e.g. an EOFError outside a command
    except KeyboardInterrupt:
        print("rankcollapse: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except CliError as exc:
        exc.show()
        return exc.exit_code
    except ClickException as exc:  # usage errors
        if isinstance(exc, NoArgsIsHelpError):
            exc.show()
            return 2
        where = getattr(getattr(exc, "ctx", None), "command_path", "rankcollapse")
        return _fail_line(f"{exc.format_message()} (see '{where} --help')")
    except Exception as exc:  # noqa: BLE001 - the boundary before any command runs
        return _fail_line(describe(exc))


def main() -> None:
    """Console entry point (see :func:`run`); returns normally on success.

    OpenMP threads waiting at a barrier sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``
    unless the caller set it; set before torch is imported; docs/performance.md, "Threads")."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    code = run()
    if code:
        sys.exit(code)


def _fail_line(message: str) -> int:
    one_line = " ".join(message.split())
    print(f"{PREFIX}{one_line}", file=sys.stderr)
    return 2
