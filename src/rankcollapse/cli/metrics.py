"""`rankcollapse metrics` sub-command."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach this sub-command to the main app (filled in by its module's owner)."""
