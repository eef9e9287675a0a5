"""Axes of the phase sweep and their expansion into cells.

A cell is a dict of every axis (defaults filled in). Values are parsed from the CLI's
``--axis NAME=v1,v2,...``; a mask spec containing commas is written with ``;`` between
its parameters (``sliding_window:w=5``, ``bigbird:w=3;g=1;r=2``).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from ..errors import ConfigError

VALUE_FAMILIES = ("gaussian", "orthogonal", "near_identity", "constructed", "pretrained")
NORM_NAMES = ("none", "sphere", "sphere_sqrtd", "layernorm", "rmsnorm")
INPUTS = ("gaussian", "sphere", "hemisphere", "minilm")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ConfigError(f"expected one of {', '.join(options)}, got {text!r}")
        return text
    return parse


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"expected a finite number >= 0, got {text!r}")
    return value


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise ConfigError(f"expected an integer in [{low}, {high}], got {value}")
        return value
    return parse


def _bool(text: str) -> bool:
    table = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}
    if text.lower() not in table:
        raise ConfigError(f"expected on/off, got {text!r}")
    return table[text.lower()]


def _mask(text: str) -> str:
    return text.replace(";", ",")


#: axis name -> (parser of one value, default). ``d_qk`` 0 means "= d_model".
AXES: dict[str, tuple[Callable[[str], Any], Any]] = {
    "qk_scale": (_float, 1.0),
    "value": (_choice(VALUE_FAMILIES), "gaussian"),
    "value_scale": (_float, 1.0),
    "norm": (_choice(NORM_NAMES), "none"),
    "placement": (_choice(("post", "pre")), "post"),
    "skip": (_bool, False),
    "mask": (_mask, "complete"),
    "d_qk": (_int(0, 4096), 0),
    "n_tokens": (_int(2, 4096), 32),
    "d_model": (_int(2, 4096), 16),
    "depth": (_int(1, 1024), 64),
    "shared": (_bool, False),
    "input": (_choice(INPUTS), "gaussian"),
}
DEFAULTS = {name: default for name, (_, default) in AXES.items()}


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """``"NAME=v1,v2"`` -> ``(NAME, [parsed values])``.

    Raises
    ------
    ConfigError
        Unknown axis, missing ``=``, empty list, a value the axis does not accept.
    """
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq or name not in AXES:
        raise ConfigError(f"--axis expects NAME=v1,v2,... with NAME one of {', '.join(AXES)}, got {text!r}")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise ConfigError(f"--axis {name}: no values")
    parse = AXES[name][0]
    try:
        return name, [parse(v) for v in items]
    except ConfigError as exc:
        raise ConfigError(f"--axis {name}: {exc}") from None


def expand_grid(axes: dict[str, list[Any]], fixed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every combination of ``axes`` (in the given order, last axis fastest) over the
    defaults updated by ``fixed``; a combination the dynamics cannot run raises.

    Raises
    ------
    ConfigError
        Unknown axis name in ``axes`` or ``fixed``.
    """
    fixed = dict(fixed or {})
    unknown = (set(axes) | set(fixed)) - set(AXES)
    if unknown:
        raise ConfigError(f"unknown axes {sorted(unknown)}; choose from {', '.join(AXES)}")
    base = {**DEFAULTS, **fixed}
    names = list(axes)
    return [{**base, **dict(zip(names, combo))} for combo in itertools.product(*(axes[n] for n in names))]
