"""The ``rankcollapse`` command line: a thin layer over the Python API.

Each sub-command module imports the numerical packages only inside its commands
(``benchmarks/bench_startup.py``). Every error prints one line and exits
with status 2 (:mod:`._boundary`); a real interrupt exits with 130.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import typer
from ._click import ClickException, NoArgsIsHelpError

from . import mask, metrics, phase, probe, reproduce, simulate, theory
from ._boundary import PREFIX, CliError, Group, describe

app = typer.Typer(name="rankcollapse", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  cls=Group, help="Measure, simulate and explain rank collapse in transformer self-attention.")
#: commands whose finished units are cached: the same command rerun resumes where it stopped
RESUMABLE = ("reproduce", "phase")


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"rankcollapse {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


app.add_typer(mask.mask_app, name="mask")
app.command("metrics", short_help="Collapse and anisotropy metrics of a saved token array or of saved hidden states.")(
    metrics.metrics_command)
app.command("simulate")(simulate.simulate_command)
app.add_typer(theory.sub, name="theory")
app.command("probe")(probe.probe_command)
app.command("reproduce", help=reproduce.HELP, short_help="Run an experiment on real text: its table, plots, claims and report.")(
    reproduce.reproduce_command)
app.command("phase")(phase.phase)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); the exit status: 0, 2 for every
    error (one line on stderr), 130 for a real interrupt."""
    try:
        rv = app(args=None if argv is None else list(argv), standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort as exc:
        if not (isinstance(exc.__cause__, KeyboardInterrupt) or exc.__cause__ is None):
            return _fail_line(describe(exc.__cause__))  # e.g. an EOFError outside a command
        rv = 130
    except KeyboardInterrupt:
        rv = 130
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
    if rv == 130:  # typer also turns a KeyboardInterrupt into exit status 130
        print(interrupted(sys.argv[1:] if argv is None else argv), file=sys.stderr)
    return rv if isinstance(rv, int) else 0


def interrupted(argv: Sequence[str]) -> str:
    """The line an interrupted command ends with: it says to rerun only where that resumes."""
    command = next((str(w) for w in argv if not str(w).startswith("-")), "")
    return "rankcollapse: interrupted" + ("; rerun the same command to resume" if command in RESUMABLE else "")


def main() -> None:
    """Console entry point (:func:`run`); OpenMP threads at a barrier sleep, not spin, unless the
    caller set ``OMP_WAIT_POLICY`` (docs/performance.md, "Threads")."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    code = run()
    if code:
        sys.exit(code)


def _fail_line(message: str) -> int:
    one_line = " ".join(message.split())
    print(f"{PREFIX}{one_line}", file=sys.stderr)
    return 2
