"""Error types. Every user-facing error is a ``ValueError`` subclass so that API
callers can catch it generically and the CLI can turn it into one line and exit
status 2."""

from __future__ import annotations


class RankCollapseError(ValueError):
    """Base class of every error the toolkit raises on bad input.

    ``argument`` names the argument the error concerns, as the API spells it (None: no
    single argument); the message then reads ``f"{argument} {detail}"``, and the command
    line shows the argument's flag in its place (``cli/_vocab.py`` ``FLAGS``).

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
    """A tokenizer that cannot represent the text: none, no ordinary (non-special)
    vocabulary, or windows of fewer than 2 distinct ordinary tokens."""


class StatesError(DataError):
    """A folder of hidden states that cannot be read as one
    (:func:`rankcollapse.models.read_states`): a missing or malformed sidecar, tensors of
    the wrong shape or dtype, non-finite values, point names that are not the project's."""


class AssetMissingError(RankCollapseError):
    """A model or corpus package is not installed; the message names the install command."""


class ModelError(RankCollapseError):
    """A model cannot be loaded or does not support the requested intervention."""


class ConvergenceError(RankCollapseError):
    """An iterative solver did not converge; the message says what was tried."""


class MemoryLimitError(ConfigError):
    """A request whose estimated memory exceeds the limit; the message gives the
    estimate and the limit; it concerns the argument ``max_memory``."""


class OutputBusyError(RankCollapseError):
    """The output folder is held by another live run (the message names it)."""


class UnsafePathError(RankCollapseError):
    """A path the toolkit would write through or read as its own record is not a regular
    file of its folder (a symbolic link, a device, a FIFO): it is refused, never followed."""


#: The most characters of a file's content (or any other foreign text) an error quotes.
EXCERPT_CHARS = 40


def excerpt(text: object, limit: int = EXCERPT_CHARS) -> str:
    """A short, escaped quotation of ``text`` for an error message.

    Errors about a file's content quote at most ``limit`` characters of it, and nothing
    past its first control character, escaped with ``repr`` (a NUL appears as
    ``\\x00``), followed by how many were left out, so a message never echoes a whole
    file (``/proc/self/environ`` holds secrets) and always stays one short line.

    >>> excerpt("a b")
    "'a b'"
    >>> excerpt("x" * 50, limit=4)
    "'xxxx' (+46 more characters)"
    """
    s = str(text)
    # a control character (NUL, escape...) means the text is not what was expected
    # (a binary file, an environment block): quote nothing past it
    cut = next((i for i, ch in enumerate(s[:limit]) if ch != "\t" and (ch < " " or ch == "\x7f")), None)
    keep = limit if cut is None else cut + 1
    if len(s) <= keep:
        return repr(s)
    return f"{s[:keep]!r} (+{len(s) - keep} more characters)"
