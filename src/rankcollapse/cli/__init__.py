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

_SUBCOMMAND_MODULES = ("mask", "metrics", "simulate", "theory", "probe", "reproduce")

for _name in _SUBCOMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_name}").register(app)


def fail(message: str) -> None:
    """Print ``rankcollapse: error: message`` to stderr and exit with status 2."""
    typer.echo(f"rankcollapse: error: {message}", err=True)
    raise typer.Exit(code=2)


def main() -> None:
    """Console entry point."""
    try:
        app(standalone_mode=False)
    except RankCollapseError as exc:
        print(f"rankcollapse: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("rankcollapse: aborted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("rankcollapse: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.exceptions.ClickException):
            print(f"rankcollapse: error: {exc.format_message()}", file=sys.stderr)
            sys.exit(2)
        raise
