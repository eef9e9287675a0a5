"""The one import of typer's vendored click, a private module of typer.

Since typer 0.26.0 typer carries its own copy of click (``typer._click``), and the
objects the command line needs beyond typer's public API live only there: the
exception classes the error boundary raises and catches, the current context and the
source of a parameter's value. Every other module of the CLI imports them from here, so
a typer release that moves them breaks this one file with one ``ImportError``, and the
``typer`` requirement in ``pyproject.toml`` is pinned to the versions this file
supports (``>=0.26,<0.30``).
"""

from __future__ import annotations

from typer import _click as click
from typer._click.core import ParameterSource
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer._click.globals import get_current_context

__all__ = ["ClickException", "NoArgsIsHelpError", "ParameterSource", "click", "get_current_context"]
