"""Old names kept as deprecated aliases: one warning, one removal version.

A renamed public argument, attribute or table key keeps its old name until
:data:`REMOVAL`; using it emits a :class:`FutureWarning` (shown to end users by default,
unlike ``DeprecationWarning``) that names the new name and the removal version. The
command line's deprecated flags say the same on stderr (``rankcollapse.cli._vocab``).
The renames are listed in docs/cli.md ("Renamed names").
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

from .errors import ConfigError

#: The version in which every deprecated alias is removed.
REMOVAL = "0.3.0"

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Emit the :class:`FutureWarning` of a renamed name: ``old`` -> ``new``."""
    warnings.warn(f"{old} is deprecated and will be removed in {REMOVAL}; use {new}", FutureWarning,
                  stacklevel=stacklevel)


def renamed_arguments(**old_to_new: str) -> Callable[[F], F]:
    """Decorator: keyword arguments ``old`` are accepted for ``new`` with a FutureWarning.

    Raises
    ------
    ConfigError
        Both the old and the new name given in one call.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise ConfigError(f"{fn.__name__}: give {new}= or the deprecated {old}=, not both")
                    warn_renamed(f"{fn.__name__}({old}=...)", f"{new}=", stacklevel=3)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_attribute(old: str, new: str) -> property:
    """A read-only property ``old`` that warns and returns the attribute ``new``."""

    def get(self: Any) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", f".{new}", stacklevel=3)
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of :attr:`{new}` (removed in {REMOVAL}).")
