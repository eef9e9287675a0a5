"""Argument validation shared by every layer: one rule, one message, a typed error.

Each check returns the value in its canonical Python type or raises ``error`` (a
:class:`~rankcollapse.errors.RankCollapseError` subclass chosen by the caller, so a
mask constructor raises :class:`MaskError` and ``simulate`` :class:`ConfigError`)
with a message that names the argument. Integers must fit a signed 64-bit integer
(numpy and torch, which consume them, cannot hold more); numbers must be finite.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from .errors import ConfigError, RankCollapseError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _numpy(*names: str) -> tuple[type, ...]:
    """The numpy scalar types ``names``, without importing numpy (the command line's
    start-up does not): if numpy was never imported, no value can be a numpy scalar."""
    np = sys.modules.get("numpy")
    return tuple(getattr(np, n) for n in names) if np is not None else ()


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None,
              error: type[RankCollapseError] = ConfigError) -> int:
    """``value`` as a Python ``int`` in ``[low, high]`` (bounds optional).

    Accepts ``int`` and numpy integers; rejects ``bool``, floats (even integral ones),
    and integers outside the signed 64-bit range.

    Raises
    ------
    error
        Naming ``name``, the value and the rule it breaks.
    """
    if isinstance(value, bool) or not isinstance(value, (int, *_numpy("integer"))):
        raise error(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise error(f"{name} must fit a signed 64-bit integer, got {value}")
    if low is not None and value < low:
        raise error(f"{name} must be an integer >= {low}, got {value}")
    if high is not None and value > high:
        raise error(f"{name} must be an integer <= {high}, got {value}")
    return value


def check_positive_int(value: Any, name: str, *, error: type[RankCollapseError] = ConfigError) -> int:
    """``value`` as an ``int >= 1`` (see :func:`check_int`)."""
    return check_int(value, name, low=1, error=error)


def check_float(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                strict_low: bool = False, error: type[RankCollapseError] = ConfigError) -> float:
    """``value`` as a finite Python ``float`` with ``value >= low`` (``> low`` when
    ``strict_low``) and ``value <= high``.

    Accepts ints, floats and numpy numbers; rejects ``bool``, strings, NaN and ±inf.

    Raises
    ------
    error
        Naming ``name``, the value and the rule it breaks.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, *_numpy("integer", "floating"))):
        raise error(f"{name} must be a number, got {value!r}")
    try:
        out = float(value)
    except OverflowError:  # an int beyond float range
        raise error(f"{name} must be a finite number, got {value}") from None
    if not math.isfinite(out):
        raise error(f"{name} must be a finite number, got {value!r}")
    if low is not None and (out <= low if strict_low else out < low):
        raise error(f"{name} must be {'>' if strict_low else '>='} {low}, got {value!r}")
    if high is not None and out > high:
        raise error(f"{name} must be <= {high}, got {value!r}")
    return out


def check_device(value: Any, name: str = "device", *, error: type[RankCollapseError] = ConfigError):
    """``value`` as a ``torch.device`` that exists on this machine (CUDA index below
    the device count, MPS only where available)."""
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise error(f"{name} {value!r} is not a torch device ({exc})") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise error(f"{name} {value!r} is not available: this machine has {count} CUDA device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise error(f"{name} {value!r} is not available on this machine")
    return dev


def check_tensor_storage(value: Any, name: str, *, error: type[RankCollapseError] = ConfigError) -> None:
    """Refuse a ``torch.Tensor`` whose entries cannot be read as a dense array: a sparse
    layout (COO, CSR, CSC, BSR, BSC) or a tensor on the ``meta`` device (shape without
    data). Anything else (numpy arrays, lists, dense tensors) passes untouched.

    Raises
    ------
    error
        Naming ``name`` and the layout or device, with the conversion to use.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return
    if value.layout != torch.strided:
        layout = str(value.layout).replace("torch.", "")
        raise error(f"{name} must be a dense tensor, got layout {layout} (convert it with .to_dense())")
    if value.device.type == "meta":
        raise error(f"{name} is a tensor on the meta device: it has a shape but no values")


def parse_params(spec: Any, what: str, *, error: type[RankCollapseError] = ConfigError) -> tuple[str, dict[str, str]]:
    """Split a ``NAME[:key=value,...]`` spec into its name and its raw values, in order.

    The one reader of this grammar (masks, attention operators, weight families): the
    caller checks the name, the keys and converts the values. Names, keys and values
    are stripped; empty items (``a=1,,b=2``) are skipped.

    Raises
    ------
    error
        ``spec`` is not a string, an item has no ``=`` or no key, or a key is given twice
        (``sink:b=2,b=3`` is refused, not read as ``b=3``).

    >>> parse_params("sink:b=2, c = 3", "attention")
    ('sink', {'b': '2', 'c': '3'})
    """
    if not isinstance(spec, str):
        raise error(f"{what} must be a string NAME[:key=value,...], got {type(spec).__name__} {spec!r}")
    name, _, rest = spec.partition(":")
    name = name.strip()
    values: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise error(f"{what} {name!r}: expected key=value, got {item!r}")
        if key in values:
            raise error(f"{what} {name!r}: key {key!r} given twice")
        values[key] = raw.strip()
    return name, values
