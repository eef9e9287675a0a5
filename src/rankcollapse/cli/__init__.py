"""The ``rankcollapse`` command line: a thin layer over the Python API.

Each sub-command lives in its own module exposing ``register(app)``. Errors that
are the user's (``RankCollapseError``) print one line and exit with status 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from ..errors import RankCollapseError

app = typer.Typer(
    name="rankcollapse",
    help="Measure, simulate and explain rank collapse in transformer self-attention.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_SUBCOMMAND_MODULES = ("mask", "metrics", "simulate", "theory", "probe", "reproduce", "phase")

for _name in _SUBCOMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_name}").register(app)


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit status 2."""
    try:
        app(standalone_mode=False)
    except RankCollapseError as exc:
        _fail_line(str(exc))
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("rankcollapse: aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("rankcollapse: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # click usage errors (typer vendors click)
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()
            sys.exit(2)
        where = getattr(getattr(exc, "ctx", None), "command_path", "rankcollapse")
        _fail_line(f"{exc.format_message()} (see '{where} --help')")


def _fail_line(message: str) -> None:
    one_line = " ".join(message.split())
    print(f"rankcollapse: error: {one_line}", file=sys.stderr)
    sys.exit(2)
