"""Error types. Every user-facing error is a ``ValueError`` subclass so that API
callers can catch it generically and the CLI can turn it into one line and exit
status 2."""

from __future__ import annotations


class RankCollapseError(ValueError):
    """Base class of every error the toolkit raises on bad input."""


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


class AssetMissingError(RankCollapseError):
    """A model or corpus package is not installed; the message names the install command."""


class ModelError(RankCollapseError):
    """A model cannot be loaded or does not support the requested intervention."""


class ConvergenceError(RankCollapseError):
    """An iterative solver did not converge; the message says what was tried."""


class MemoryLimitError(ConfigError):
    """A request whose estimated memory exceeds the limit; the message gives the
    estimate and the option (``--max-memory``) that lifts it."""


class OutputBusyError(RankCollapseError):
    """The output folder is held by another live run (the message names it)."""
