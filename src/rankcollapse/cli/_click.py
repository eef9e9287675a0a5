"""The one import of ``typer._click``, typer's private copy of click (typer >= 0.26): what
the CLI needs beyond typer's public API. The pin ``typer>=0.26,<0.30`` (pyproject.toml) is
what this file supports."""

from __future__ import annotations

from typer import _click as click
from typer._click.core import ParameterSource
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer._click.globals import get_current_context

__all__ = ["ClickException", "NoArgsIsHelpError", "ParameterSource", "click", "get_current_context"]
