"""Argument validation shared by every layer: each check returns the value in its Python type
or raises the caller's ``error`` class naming the argument. Integers fit int64 (numpy and torch
consume them); numbers are finite."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .errors import ConfigError, RankCollapseError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _numpy(*names: str) -> tuple[type, ...]:
    """The numpy scalar types ``names``, without importing numpy (none if it was never imported)."""
    np = sys.modules.get("numpy")
    return tuple(getattr(np, n) for n in names) if np is not None else ()


def check_int(value: Any, name: str, *, low: int | None = None, high: int | None = None,
              error: type[RankCollapseError] = ConfigError) -> int:
    """``value`` (an ``int`` or numpy integer, not ``bool`` or float) as an ``int`` in ``[low, high]``;
    else ``error`` naming ``name``, the value and the rule."""
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


def check_float(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                strict_low: bool = False, error: type[RankCollapseError] = ConfigError) -> float:
    """``value`` (a number, not ``bool``) as a finite ``float`` with ``value >= low`` (``> low``
    when ``strict_low``) and ``<= high``; else ``error`` naming ``name``, the value and the rule."""
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
    """``value`` as a ``torch.device`` that exists on this machine."""
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
    elif dev.type == "meta":  # tensors there have shapes but no values: nothing can be measured
        raise error(f"{name} {value!r} holds shapes without values; give a device that computes (cpu, cuda)")
    return dev


def check_tensor_storage(value: Any, name: str, *, error: type[RankCollapseError] = ConfigError) -> None:
    """Refuse (``error``) a ``torch.Tensor`` with a sparse layout or on the ``meta`` device;
    anything else passes."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return
    if value.layout != torch.strided:
        layout = str(value.layout).replace("torch.", "")
        raise error(f"{name} must be a dense tensor, got layout {layout} (convert it with .to_dense())")
    if value.device.type == "meta":
        raise error(f"{name} is a tensor on the meta device: it has a shape but no values")


#: ``Key.default`` of a key the spec must give
REQUIRED = object()


@dataclass(frozen=True)
class Key:
    """One key of a spec: name, kind (:data:`KINDS`), default (:data:`REQUIRED`: must be given)."""

    name: str
    kind: str = "float"
    default: Any = REQUIRED
    help: str = ""


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _finite(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(raw)
    return value


def _bool(raw: str) -> bool:
    if raw.lower() not in _TRUE | _FALSE:
        raise ValueError(raw)
    return raw.lower() in _TRUE


#: kind -> (converter of the raw text, what it accepts)
KINDS: dict[str, tuple[Callable[[str], Any], str]] = {
    "int": (int, "an integer"),
    "float": (_finite, "a finite number"),
    "bool": (_bool, "true or false"),
    "ints": (lambda raw: tuple(int(x) for x in raw.split("+")) if raw else (), "integers joined by '+'"),
    "str": (str, "a string"),
}


@dataclass(frozen=True)
class Spec:
    """A ``NAME[:key=value,...]`` spec (masks, operators, weights, inputs, temperature laws),
    read by :meth:`parse`; ``str`` writes it back.

    >>> Spec.parse("sink:b=2, c = 3", "attention")
    Spec(name='sink', params={'b': '2', 'c': '3'})
    >>> str(Spec("sliding_window", {"w": 9}))
    'sliding_window:w=9'
    """

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name + (":" + ",".join(f"{k}={v}" for k, v in self.params.items()) if self.params else "")

    @staticmethod
    def name_of(text: Any) -> str:
        """The name of ``text`` (``sliding_window:w=9`` -> ``sliding_window``), unchecked."""
        return str(text).partition(":")[0].strip()

    @classmethod
    def parse(cls, text: Any, what: str, *, names: Mapping[str, Sequence[Key]] | None = None,
              error: type[RankCollapseError] = ConfigError, short: bool = False) -> "Spec":
        """Read ``text``; names, keys and values stripped, empty items (``a=1,,b=2``) skipped.
        ``what``: the kind of spec, for messages (``"mask"``, ``"attention"``). ``names``: None for
        any name and key, values kept as strings; else the names the spec may have, each with its
        keys: values are converted to their key's kind and a :data:`REQUIRED` key must be given
        (defaults are not filled in). ``short``: ``NAME:value`` reads as ``NAME:key=value`` for a
        name with one key. Raises ``error`` naming the spec and key: not a string, an item without
        ``key=``, a key given twice; with ``names``, an unknown name or key, a bad value, a required
        key missing."""
        if not isinstance(text, str):
            raise error(f"{what} must be a string NAME[:key=value,...], got {type(text).__name__} {text!r}")
        name, _, rest = text.partition(":")
        name = name.strip()
        keys = None
        if names is not None:
            if name not in names:
                raise error(f"unknown {what} {name!r}; choose one of {', '.join(names)}")
            keys = {k.name: k for k in names[name]}
        items = [s.strip() for s in rest.split(",") if s.strip()]
        if short and keys is not None and len(keys) == 1 and len(items) == 1 and "=" not in items[0]:
            items = [f"{next(iter(keys))}={items[0]}"]
        params: dict[str, Any] = {}
        for item in items:
            key, eq, raw = (s.strip() for s in item.partition("="))
            if not eq or not key:
                raise error(f"{what} {text!r}: expected key=value, got {item!r}")
            if key in params:
                raise error(f"{what} {text!r}: key {key!r} given twice")
            if keys is None:
                params[key] = raw
                continue
            if key not in keys:
                takes = f"takes parameters {', '.join(keys)}" if keys else "takes no parameters"
                raise error(f"{what} {text!r}: {name!r} has no key {key!r}; it {takes}")
            convert, want = KINDS[keys[key].kind]
            try:
                params[key] = convert(raw)
            except ValueError:
                raise error(f"{what} {text!r}: key {key!r} must be {want}, got {raw!r}") from None
        for k in (keys or {}).values():
            if k.default is REQUIRED and k.name not in params:
                raise error(f"{what} {text!r}: {name!r} needs key {k.name!r} (e.g. {name}:{k.name}=...)")
        return cls(name, params)
