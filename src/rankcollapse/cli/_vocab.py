"""One flag name per concept on every command, and the old spellings as hidden aliases.

The canonical vocabulary (docs/cli.md): ``--n-tokens``, ``--n-samples``, ``--d-model``,
``--model``, ``--metrics``, ``--seed``, ``--device``, ``--out`` (a folder) and
``--format json|csv|markdown|table``. An old spelling is rewritten to its canonical
flag before the command line is parsed, only on commands that have that flag and do
not use the old name for something else, so it never shows in ``--help``; the command
then prints one deprecation note per old flag on stderr once it has succeeded (a
failed command prints only its one error line). Every old spelling is removed in
version :data:`~rankcollapse._deprecation.REMOVAL` (0.3.0), as the note says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from .._deprecation import REMOVAL
from ._click import click, get_current_context

#: old spelling -> the canonical tokens it stands for (first token = canonical flag)
DEPRECATED: dict[str, tuple[str, ...]] = {
    "--n": ("--n-tokens",),
    "--length": ("--n-tokens",),
    "--windows": ("--n-samples",),
    "--samples": ("--n-samples",),
    "--d": ("--d-model",),
    "--pretrained": ("--model",),
    "--names": ("--metrics",),
    "--text": ("--text-file",),
    "--json": ("--format", "json"),
}

NOTE = "rankcollapse: note: {old} is deprecated and will be removed in " + REMOVAL + "; use {new}"


#: an API error's words for an argument -> the flag a command-line user typed (the API
#: names its arguments; the command line names its flags): (pattern, replacement)
API_TO_FLAGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bn_tokens=(\d+) was asked"), r"--n-tokens \1 was asked"),
    (re.compile(r"runs on path='dense' only"), "runs on --backend dense only"),
    (re.compile(r"use path='dense' or 'auto'"), "use --backend dense or auto"),
    (re.compile(r"^qk_norm_scale is a setting of qk_norm=True$"), "--qk-norm-scale is a setting of --qk-norm (give both)"),
    *((re.compile(rf"^{re.escape(arg)} does not apply to "), f"{flag} does not apply to ") for arg, flag in (
        ("text", "--text-file"), ("n_tokens", "--n-tokens"), ("overrides['masks']", "--mask"),
        ("overrides['depth']", "--depth"), ("overrides['n_samples']", "--n-samples"),
        ("overrides['extra_models']", "--model"))),
    (re.compile(r"raise the limit with max_memory \(--max-memory on the command line\)"),
     "raise the limit with --max-memory (e.g. --max-memory 32GiB)"),
)


def in_flags(message: str) -> str:
    """``message`` (an API error's) with the arguments it names as the command's flags
    (:data:`API_TO_FLAGS`); other text unchanged."""
    for pattern, flag in API_TO_FLAGS:
        message = pattern.sub(flag, message)
    return message


def _flags(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def rewrite(command: click.Command, args: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(args with old spellings replaced, one note per old flag used)``.

    ``--old VALUE`` and ``--old=VALUE`` both map; arguments after ``--`` are left
    alone. An old spelling the command itself defines (or whose canonical flag it
    lacks) is not touched, so unknown options still fail as usage errors."""
    flags = _flags(command)
    out: list[str] = []
    notes: dict[str, str] = {}
    args = list(args)
    for i, arg in enumerate(args):
        if arg == "--":
            out.extend(args[i:])
            break
        name, eq, value = arg.partition("=")
        new = DEPRECATED.get(name)
        if new is None or name in flags or new[0] not in flags:
            out.append(arg)
            continue
        if eq and len(new) > 1:  # --json=... is no valid flag use; let click say so
            out.append(arg)
            continue
        out.extend(new)
        if eq:
            out.append(value)
        notes.setdefault(name, NOTE.format(old=name, new=" ".join(new)))
    return out, list(notes.values())


def deprecated(old: str, new: str) -> None:
    """Say, once the command has succeeded, that ``old`` is deprecated for ``new`` (an
    alias handled inside a command, e.g. a positional); at once outside a command."""
    line = NOTE.format(old=old, new=new)
    ctx = get_current_context(silent=True)
    if ctx is None:
        click.echo(line, err=True)
    else:
        ctx.meta.setdefault("rankcollapse.notes", []).append(line)


def out_file(out: Path, name: str, file_suffixes: tuple[str, ...]) -> Path:
    """The file a command writes under the folder ``--out``: ``out / name``.

    The old use, ``--out FILE`` with one of ``file_suffixes`` (e.g. ``x.png``), still
    writes that file, with a deprecation note on stderr."""
    if out.suffix.lower() in file_suffixes and not out.is_dir():
        deprecated(f"--out {out} (a file)", f"--out FOLDER (writes FOLDER/{name})")
        return out
    return out / name
