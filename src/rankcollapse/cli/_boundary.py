"""The CLI's single error boundary (:meth:`Group.invoke`: any error below a command is one
line on stderr, exit 2, also in-process), the command line's words for the API's arguments
(:data:`FLAGS`, docs/cli.md) and its one-value-per-option rule."""

from __future__ import annotations

import contextlib
import errno
import inspect
import math
import os
import sys
from pathlib import PurePath
from typing import Any, Collection, Iterator, get_args

import typer
from ._click import ParameterSource, click, get_current_context
from typer.core import TyperCommand, TyperGroup, TyperOption

from .._validate import INT64_MAX, INT64_MIN
from ..errors import RankCollapseError

PREFIX = "rankcollapse: error: "
#: The longest error line printed; the toolkit's own messages are far shorter, and
#: quotations of foreign text go through :func:`rankcollapse.errors.excerpt`.
MAX_LINE = 600
#: An API argument an error names (:attr:`RankCollapseError.argument`) -> its flag
FLAGS: dict[str, str] = {
    "n_tokens": "--n-tokens", "backend": "--backend", "qk_norm_scale": "--qk-norm-scale",
    "max_memory": "--max-memory", "text": "--text-file", "executor": "--executor", "workers": "--workers",
    "address": "--address", "overrides['masks']": "--mask", "query_key": "--query-key",
    "overrides['depth']": "--depth", "overrides['n_samples']": "--n-samples", "overrides['extra_models']": "--model",
    "ablate_heads": "--ablate-heads", "head": "--patch-head", "shard": "--shard", "wait": "--wait",
    "allow_nonempty": "--allow-nonempty", "metrics": "--metrics", "d_qk": "--d-qk", "out": "--out",
}


def in_flags(exc: RankCollapseError) -> str:
    """``exc``'s message with the argument it concerns named by its flag (:data:`FLAGS`)."""
    if exc.argument is None:
        return str(exc)
    return f"{FLAGS.get(exc.argument, exc.argument)} {exc.detail}"


@contextlib.contextmanager
def n_tokens_from(where: str | None) -> Iterator[None]:
    """An error about ``n_tokens`` names ``where`` the N came from (``the N of FILE 'x.npy'``)
    instead of ``--n-tokens``, which was not given; ``where=None`` changes nothing."""
    try:
        yield
    except RankCollapseError as exc:
        if where is not None and exc.argument == "n_tokens":
            exc.argument = where
        raise


class CliError(click.ClickException):
    """A failed command: printed as one line, exit status 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        line = " ".join(str(message).split()) or "failed"
        if len(line) > MAX_LINE:  # a last guard: no error line echoes a whole file or environment
            line = f"{line[:MAX_LINE]} ... (+{len(line) - MAX_LINE} more characters)"
        super().__init__(line)

    def show(self, file: Any = None) -> None:
        click.echo(PREFIX + self.format_message(), file=file or sys.stderr)


def describe(exc: BaseException) -> str:
    """One line for ``exc``: the toolkit's message, an OS error's path and reason, or an internal error."""
    if isinstance(exc, RankCollapseError):
        return in_flags(exc)  # the argument it concerns named by its flag (FLAGS)
    if isinstance(exc, OSError):
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        where = exc.filename if exc.filename is not None else ""
        if exc.errno == errno.EEXIST:
            reason = "a file is in the way of a folder to create (or the path exists)"
        elif exc.errno == errno.ENOTDIR:
            reason = "a file is in the way where a folder is expected"
        return f"cannot use {where}: {reason}" if where else f"operating-system error: {reason}"
    if isinstance(exc, MemoryError):
        return ("out of memory: the request does not fit in RAM; shrink the input or lower --n-tokens "
                "(commands that estimate their size first take --max-memory)")
    if isinstance(exc, EOFError):
        return f"a file ended early (empty or truncated): {exc}".rstrip(": ")
    return f"internal error ({type(exc).__name__}: {exc}); please report this with the command line"


class Command(TyperCommand):
    """A command where an option that takes one value may be given only once."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        parser = self.make_parser(ctx)
        try:
            raw, _, order = parser.parse_args(args=list(args))
        except click.exceptions.BadOptionUsage as exc:  # raised without a context: point to this command's help
            raise click.exceptions.UsageError(_option_usage(exc, self), ctx=ctx) from None
        _refuse_empty_paths(raw, order, ctx)
        _refuse_options_as_values(raw, order, self, ctx)
        seen: set[str] = set()
        for param in order:
            single = isinstance(param, TyperOption) and not (param.multiple or param.count or param.is_flag)
            if single and param.name in seen:
                raise click.exceptions.UsageError(f"option {param.opts[0]} given more than once; it takes one value",
                                                  ctx=ctx)
            seen.add(param.name)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        for param in self.params:
            for value in _values(ctx.params.get(param.name)):
                _check_number(value, param, ctx)
        return super().invoke(ctx)


def _option_usage(exc: click.exceptions.BadOptionUsage, command: click.Command) -> str:
    """The message of ``exc``: an option given without its value (``simulate --depth``) is named as such."""
    param = next((p for p in command.params if exc.option_name in (*p.opts, *p.secondary_opts)), None)
    if isinstance(param, TyperOption) and not (param.is_flag or param.count):  # it takes values: none came
        return f"option {exc.option_name} needs {'a value' if param.nargs == 1 else f'{param.nargs} values'}"
    return exc.format_message()


def _refuse_options_as_values(raw: dict[str, Any], params: list, command: click.Command,
                              ctx: click.Context) -> None:
    """Refuse a value that is one of the command's own options (``simulate --mask --depth 3``
    gave ``--mask`` the value ``--depth``): the option before it was given without its value."""
    names = {o for p in command.get_params(ctx) if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    for param in params:
        if not isinstance(param, TyperOption) or param.is_flag or param.count:
            continue
        for value in _values(raw.get(param.name)):
            for item in _values(value):
                if isinstance(item, str) and item in names:
                    raise click.exceptions.UsageError(f"option {param.opts[0]} needs a value; it got the option "
                                                      f"{item} instead", ctx=ctx)


def _refuse_empty_paths(raw: dict[str, Any], params: list, ctx: click.Context) -> None:
    """Refuse an empty path (``--out ""``: an unset shell variable), else read as the working directory."""
    for param in params:
        if not _takes_path(getattr(getattr(param, "type_descriptor", None), "annotation", None)):
            continue
        for value in _values(raw.get(param.name)):
            if isinstance(value, str) and not value.strip():
                raise click.exceptions.UsageError(f"{(param.opts or [param.name])[0]} is empty (an unset shell "
                                                  "variable?); give a path", ctx=ctx)


def _takes_path(ann: Any) -> bool:
    """Whether an option's annotation is a path (``Path``, ``Optional[Path]``, ``List[Path]``)."""
    return (isinstance(ann, type) and issubclass(ann, PurePath)) or any(_takes_path(a) for a in get_args(ann))


def given_flags(allowed: Collection[str] = ()) -> list[str]:
    """The flags given on the command line but those of the parameters ``allowed``, in the command's order."""
    ctx = get_current_context(silent=True)
    given = [] if ctx is None else [p for p in ctx.command.params if p.name not in allowed
                                    and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    return [next((o for o in p.opts if o.startswith("--")), None) or p.metavar or p.name for p in given]


def _values(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _check_number(value: Any, param: Any, ctx: click.Context) -> None:
    """Every option's numbers: finite floats, integers that fit 64 bits (numpy and torch consume them)."""
    name = (param.opts or [param.name])[0]
    if isinstance(value, float) and not math.isfinite(value):
        raise click.exceptions.UsageError(f"{name} must be a finite number, got {value}", ctx=ctx)
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        raise click.exceptions.UsageError(f"{name} must fit a signed 64-bit integer, got {value}", ctx=ctx)


def one_line_paragraphs(text: str) -> str:
    """``text`` with each paragraph on one line: typer's rich help keeps the line breaks of
    every paragraph after the first, so a docstring wrapped at 90 columns would print ragged."""
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n"))
                       for p in inspect.cleandoc(text).split("\n\n"))


class Group(TyperGroup):
    """The root group: the error boundary of every sub-command."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        # typer builds every command with its own classes: no registration can miss the rules above
        if type(cmd) is TyperCommand:
            cmd.__class__ = Command
        elif type(cmd) is TyperGroup:
            cmd.__class__ = Group
        if cmd is not None and cmd.help:
            cmd.help = one_line_paragraphs(cmd.help)
        return cmd

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, click.ClickException, KeyboardInterrupt, BrokenPipeError):
            raise  # a closed stdout (`| head`) is the reader's choice, not an error of the command
        except Exception as exc:  # the boundary: any other error becomes one line, exit 2
            raise CliError(describe(exc)) from exc
