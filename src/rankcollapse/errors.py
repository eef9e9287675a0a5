"""Error types: every user-facing error is a ``ValueError`` (the CLI prints one line, exit 2)."""

from __future__ import annotations


class RankCollapseError(ValueError):
    """Base class of every error the toolkit raises on bad input.

    ``argument``: the API argument concerned (None: no single one); the message reads
    ``f"{argument} {detail}"`` and the CLI shows the flag instead (``cli/_boundary.py`` ``FLAGS``).

    >>> str(ConfigError("must be one of ('auto', 'dense'), got 'nope'", argument="backend"))
    "backend must be one of ('auto', 'dense'), got 'nope'"
    """

    def __init__(self, detail: object = "", *, argument: str | None = None) -> None:
        super().__init__(detail if argument is None else f"{argument} {detail}")
        self.detail, self.argument = str(detail), argument

    def __reduce__(self):  # worker processes send errors back pickled: keep the argument
        return _rebuild, (type(self), self.detail, self.argument)


def _rebuild(cls: type, detail: str, argument: str | None) -> RankCollapseError:
    err = cls.__new__(cls)
    RankCollapseError.__init__(err, detail, argument=argument)
    return err


class MaskError(RankCollapseError):
    """Invalid mask spec, mask file or mask matrix (names the offending rows/keys)."""


class MetricError(RankCollapseError):
    """Input a metric cannot be computed on (NaN/Inf, empty, wrong rank...)."""


class ConfigError(RankCollapseError):
    """Incompatible or out-of-range options."""


class DataError(RankCollapseError):
    """Unreadable, empty or too-short text input."""


class TokenizerError(DataError):
    """A tokenizer that cannot represent the text (none, or too few ordinary tokens)."""


class StatesError(DataError):
    """A folder that is not hidden states :func:`rankcollapse.models.read_states` can read."""


class AssetMissingError(RankCollapseError):
    """A model or corpus package is not installed; the message names the install command."""


class ModelError(RankCollapseError):
    """A model cannot be loaded or does not support the requested intervention."""


class ConvergenceError(RankCollapseError):
    """An iterative solver did not converge; the message says what was tried."""


class MemoryLimitError(ConfigError):
    """A request whose estimated memory exceeds the limit (argument ``max_memory``)."""


class OutputBusyError(RankCollapseError):
    """The output folder is held by another live run (the message names it)."""


class UnsafePathError(RankCollapseError):
    """A path the toolkit would write or read as its own record is a link or not a regular file."""


#: The most characters of a file's content (or any other foreign text) an error quotes.
EXCERPT_CHARS = 40


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """``text`` quoted with ``repr`` for an error message: at most ``limit`` characters and
    nothing past its first control character (a message never echoes a whole file).

    >>> excerpt("a b")
    "'a b'"
    >>> excerpt("x" * 50, limit=4)
    "'xxxx' (+46 more characters)"
    """
    s = str(text)
    # a control character (NUL, escape...): not text (a binary file), quote nothing past it
    cut = next((i for i, ch in enumerate(s[:limit]) if ch != "\t" and (ch < " " or ch == "\x7f")), None)
    keep = limit if cut is None else cut + 1
    if len(s) <= keep:
        return repr(s)
    return f"{s[:keep]!r} (+{len(s) - keep} more characters)"
