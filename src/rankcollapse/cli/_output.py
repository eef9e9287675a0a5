"""What the commands print: ``--format json|csv|markdown|table``, strict JSON, whole tables.

* JSON is strict (RFC 8259): a NaN or infinity becomes ``null`` (never the ``NaN`` /
  ``Infinity`` tokens Python's ``json`` writes by default); numpy and torch values
  become plain numbers or lists.
* ``table`` is a rich table on a terminal; off a terminal (a pipe, a file) the table
  is laid out as wide as its longest cells, so no name is ever cut or folded.
* ``csv`` and ``markdown`` print the command's main table, one row per record.
"""

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


def strict(obj: Any) -> Any:
    """``obj`` with non-finite floats as None and numpy/torch values as plain Python;
    other objects (e.g. paths) as their text."""
    obj = strict_json(obj)
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strict(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON text of ``obj`` (see :func:`strict`); raises if anything slips through."""
    return json.dumps(strict(obj), allow_nan=False, **kw)


def print_json(obj: Any, **kw: Any) -> None:
    sys.stdout.write(dumps(obj, **kw) + "\n")


def _cell(v: Any) -> str:
    v = strict(v)
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def print_records(rows: Sequence[dict], fmt: str, columns: Iterable[str] | None = None) -> None:
    """``rows`` as CSV (header + rows) or a GitHub markdown table on stdout."""
    cols = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(cols)
        w.writerows([[_cell(r.get(c)) for c in cols] for r in rows])
        return
    if fmt != "markdown":
        raise ConfigError(f"print_records prints csv or markdown, not {fmt!r}")
    esc = [[_cell(r.get(c)).replace("|", "\\|") for c in cols] for r in rows]
    sys.stdout.write("| " + " | ".join(cols) + " |\n| " + " | ".join("---" for _ in cols) + " |\n")
    for cells in esc:
        sys.stdout.write("| " + " | ".join(cells) + " |\n")


def print_result(fmt: str, doc: Any, rows: Sequence[dict], columns: Iterable[str] | None = None) -> bool:
    """Print ``doc`` as JSON (``fmt`` json) or ``rows`` as CSV or markdown; False for
    ``table``, which the command renders itself."""
    if fmt == "json":
        print_json(doc)
    elif fmt in ("csv", "markdown"):
        print_records(rows, fmt, columns)
    else:
        return False
    return True


def records_table(title: str, rows: Sequence[dict]) -> Any:
    """A rich table (:func:`make_table`) of ``rows``, one column per key, floats to 3 digits."""
    return make_table(title, list(rows[0]) if rows else [],
                      ([f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()] for r in rows))


def console(renderable: Any = None) -> Any:
    """A rich Console on stdout: the terminal's width on a TTY; off one, wide enough
    for ``renderable`` (a table) at its natural width, so nothing is cut."""
    from rich.console import Console

    if sys.stdout.isatty() or renderable is None:
        return Console(file=sys.stdout)
    wide = Console(file=sys.stdout, width=100_000)
    width = wide.measure(renderable).maximum
    return Console(file=sys.stdout, width=max(80, width), soft_wrap=True)


def make_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, show_header: bool = True,
               **column: Any) -> Any:
    """A rich Table of ``rows`` under ``columns`` (each with the options ``column``, e.g.
    ``overflow="fold"``) whose title, headers and text cells are literal: rich reads
    ``[...]`` as markup, so a label such as ``[random-init, seed 0]`` would vanish; every
    string is escaped (:func:`rich.markup.escape`). A cell that is already a rich
    renderable (a styled ``rich.text.Text``) is kept as it is; other cells become their text."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), show_header=show_header)
    for col in columns:
        table.add_column(escape(str(col)), **column)
    for row in rows:
        table.add_row(*(cell if hasattr(cell, "__rich_console__") else escape(str(cell)) for cell in row))
    return table


def print_table(table: Any) -> None:
    """Print a rich table (built by :func:`make_table`) on stdout (whole names off a
    terminal; see :func:`console`)."""
    console(table).print(table)
