"""What the commands print (``--format table|json|csv|markdown``): strict JSON (NaN and
infinities as ``null``), CSV or markdown of the main table, rich tables never cut off a terminal."""

from __future__ import annotations

import csv
import json
import sys
from typing import Any, Iterable, Sequence

import typer

from .._io import strict_json
from ..errors import ConfigError

FORMATS = ("table", "json", "csv", "markdown")
FORMAT_HELP = "Output on stdout: table, json, csv or markdown."
#: The ``--allow-nonempty`` option of every command that writes ``--out``.
ALLOW_NONEMPTY = typer.Option(False, "--allow-nonempty", help="Write into a non-empty --out that no run wrote, beside "
                              "its files (a file of the same name as an output is still refused; by default such a "
                              "folder is refused).")


def check_format(fmt: str, allowed: Sequence[str] = FORMATS) -> str:
    """``fmt`` if this command can print it, else :class:`ConfigError` (exit 2)."""
    if fmt not in allowed:
        raise ConfigError(f"--format must be one of {', '.join(allowed)} here, got {fmt!r}")
    return fmt


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON text of ``obj`` (:func:`~rankcollapse._io.strict_json`; any other object as its text)."""
    return json.dumps(strict_json(obj), allow_nan=False, default=str, **kw)


def print_json(obj: Any, **kw: Any) -> None:
    sys.stdout.write(dumps(obj, **kw) + "\n")


def _cell(v: Any) -> str:
    v = strict_json(v)
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v if isinstance(v, str) else dumps(v) if isinstance(v, (list, dict)) else str(v)


def print_records(rows: Sequence[dict], fmt: str, columns: Iterable[str] | None = None) -> None:
    """``rows`` as CSV (header + rows) or a GitHub markdown table on stdout."""
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        w.writerows([[_cell(r.get(c)) for c in cols] for r in rows])
        return
    esc = [[_cell(r.get(c)).replace("|", "\\|") for c in cols] for r in rows]
    sys.stdout.write("| " + " | ".join(cols) + " |\n| " + " | ".join("---" for _ in cols) + " |\n")
    for cells in esc:
        sys.stdout.write("| " + " | ".join(cells) + " |\n")


def print_result(fmt: str, doc: Any, rows: Sequence[dict], columns: Iterable[str] | None = None, *,
                 indent: int | None = None) -> bool:
    """Print ``doc`` as JSON (``fmt`` json) or ``rows`` as CSV or markdown; False for
    ``table``, which the command renders itself."""
    if fmt == "json":
        print_json(doc, indent=indent)
    elif fmt in ("csv", "markdown"):
        print_records(rows, fmt, columns)
    else:
        return False
    return True


def records_table(title: str, rows: Sequence[dict]) -> Any:
    """A rich table (:func:`make_table`) of ``rows``, one column per key, floats to 3 digits."""
    return make_table(title, list(rows[0]) if rows else [],
                      ([f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()] for r in rows))


def make_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, show_header: bool = True,
               **column: Any) -> Any:
    """A rich Table of ``rows`` under ``columns`` (each with the options ``column``); every
    string is escaped (rich would read ``[random-init, seed 0]`` as markup), rich renderables kept."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), show_header=show_header)
    for col in columns:
        table.add_column(escape(str(col)), **column)
    for row in rows:
        table.add_row(*(cell if hasattr(cell, "__rich_console__") else escape(str(cell)) for cell in row))
    return table


def print_table(table: Any) -> None:
    """Print a rich table on stdout: at the terminal's width, or off one as wide as the table (nothing cut)."""
    from rich.console import Console

    if not sys.stdout.isatty():
        width = Console(file=sys.stdout, width=100_000).measure(table).maximum
        Console(file=sys.stdout, width=max(80, width), soft_wrap=True).print(table)
    else:
        Console(file=sys.stdout).print(table)
