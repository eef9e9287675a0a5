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


def expand_grid(axes: dict[str, list[Any]], fixed: dict[str, Any] | None = None,
                zipped: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every combination of ``axes`` (in the given order, last axis fastest) over the
    defaults updated by ``fixed``; a combination the dynamics cannot run raises.

    The axes named in ``zipped`` vary together instead of being crossed: value ``i`` of
    each goes with value ``i`` of the others (equal-length lists, repeats allowed), and
    that list of tuples is crossed with the other axes at the position of the first
    zipped axis. This runs a stratified subset: the full product of the other axes
    against a short design of the zipped ones that still holds every value of each.

    Raises
    ------
    ConfigError
        Unknown axis name in ``axes``, ``fixed`` or ``zipped``; a zipped axis not in
        ``axes``; fewer than two zipped axes; zipped lists of different lengths.
    """
    fixed = dict(fixed or {})
    unknown = (set(axes) | set(fixed) | set(zipped)) - set(AXES)
    if unknown:
        raise ConfigError(f"unknown axes {sorted(unknown)}; choose from {', '.join(AXES)}")
    base = {**DEFAULTS, **fixed}
    factors: list[list[dict[str, Any]]] = []
    if zipped:
        if len(set(zipped)) < 2 or any(z not in axes for z in zipped):
            raise ConfigError(f"--zip needs two or more distinct axes given with --axis, got {', '.join(zipped)}")
        lengths = {z: len(axes[z]) for z in zipped}
        if len(set(lengths.values())) != 1:
            raise ConfigError(f"zipped axes need lists of equal length, got {lengths}")
    done = False
    for name in axes:
        if name in zipped:
            if not done:
                factors.append([dict(zip(zipped, combo)) for combo in zip(*(axes[z] for z in zipped))])
                done = True
            continue
        factors.append([{name: v} for v in axes[name]])
    cells = []
    for combo in itertools.product(*factors):
        cell = dict(base)
        for part in combo:
            cell.update(part)
        cells.append(cell)
    return cells
