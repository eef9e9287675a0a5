"""Old names kept as deprecated aliases: one warning, one removal version.

A renamed public argument, attribute or table key keeps its old name until
:data:`REMOVAL`; using it emits a :class:`FutureWarning` (shown to end users by default,
unlike ``DeprecationWarning``) that names the new name and the removal version. The
command line's deprecated flags say the same on stderr (``rankcollapse.cli._vocab``).
The renames are listed in docs/cli.md ("Renamed names").
"""

from __future__ import annotations

import functools
import inspect
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

    ``@renamed_arguments(n="n_tokens")`` on ``def causal(n_tokens)`` keeps ``causal(5)``
    and ``causal(n_tokens=5)`` silent and makes ``causal(n=5)`` warn and call
    ``causal(n_tokens=5)``. Under ``@classmethod``/``@staticmethod``, put it below them.
    The wrapper's ``__renamed__`` holds the mapping ``{old: new}`` (read by the tests
    that list every renamed argument).

    Raises
    ------
    ConfigError
        Both the old and the new name given in one call (the new one by keyword or by
        position).
    """

    def decorate(fn: F) -> F:
        name = fn.__qualname__ if "<" not in fn.__qualname__ else fn.__name__
        # where each new name sits among the positional parameters (None: keyword-only or
        # absent), read once here so that a call costs a dict lookup and a length test
        code = getattr(inspect.unwrap(fn), "__code__", None)
        positional = code.co_varnames[:code.co_argcount] if code is not None else ()
        index = {new: positional.index(new) if new in positional else None for new in old_to_new.values()}

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    at = index[new]
                    if new in kwargs or (at is not None and len(args) > at):
                        how = "by position" if new not in kwargs else "by keyword"
                        raise ConfigError(f"{name}: give {new}= or the deprecated {old}=, not both "
                                          f"({new} was given {how})")
                    warn_renamed(f"{name}({old}=...)", f"{new}=", stacklevel=3)
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        wrapper.__renamed__ = dict(old_to_new)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_attribute(old: str, new: str) -> property:
    """A read-only property ``old`` that warns and returns the attribute ``new``."""

    def get(self: Any) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", f".{new}", stacklevel=3)
        return getattr(self, new)

    return property(get, doc=f"Deprecated alias of :attr:`{new}` (removed in {REMOVAL}).")
