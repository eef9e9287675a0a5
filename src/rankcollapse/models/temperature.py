"""The attention temperature of a pretrained model, as ``d_qk``.

A model scores ``q·k · scaling``; in the paper's notation (Sec. 3, Eq. (1)) scores are
``q·k / sqrt(d_qk)``, so its own ``d_qk = 1 / scaling²``, and another ``d_qk = D`` is the
intervention ``d_qk_scale = D · scaling²`` (docs/models.md, "Interventions").
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError, ModelError
from . import families
from .loading import as_loaded


def model_d_qk(loaded: Any) -> float:
    """The model's own ``d_qk = 1 / scaling²``; :class:`ModelError` for unknown
    self-attention modules, a non-numeric ``scaling``, or modules that disagree."""
    loaded = as_loaded(loaded)
    scalings = set()
    for stack in families.stacks(loaded.model, loaded.family):
        for block in stack.blocks:
            if block.self_attn is None:
                raise ModelError(f"d_qk= is not supported for {type(loaded.model).__name__} ({loaded.family} layout): "
                                 "no self-attention module the toolkit knows")
            s = getattr(block.self_attn, "scaling", None)
            if not isinstance(s, (int, float)) or not s > 0:
                raise ModelError(f"{type(block.self_attn).__name__} has no numeric 'scaling'; cannot set d_qk")
            scalings.add(float(s))
    if len(scalings) != 1:
        raise ModelError(f"the model's attention modules use different scalings {sorted(scalings)}; "
                         "give d_qk_scale instead of d_qk")
    return 1.0 / scalings.pop() ** 2


def check_d_qk(d_qk: Any, name: str = "d_qk") -> float:
    """``d_qk`` (or another temperature, ``name``) as a float; :class:`ConfigError` (argument
    ``name``) unless positive and finite."""
    if isinstance(d_qk, bool) or not isinstance(d_qk, (int, float)) or not (math.isfinite(d_qk) and d_qk > 0):
        raise ConfigError(f"must be a positive finite number, got {d_qk!r}", argument=name)
    return float(d_qk)


def d_qk_scale_for(loaded: Any, d_qk: float | None, d_qk_scale: float = 1.0) -> float:
    """The ``d_qk_scale`` that gives attention temperature ``d_qk`` (None: ``d_qk_scale``);
    :class:`ConfigError` for a bad ``d_qk`` or both given, :class:`ModelError` as :func:`model_d_qk`."""
    if d_qk is None:
        return d_qk_scale
    check_d_qk(d_qk)
    if d_qk_scale != 1.0:
        raise ConfigError("give d_qk or d_qk_scale, not both (d_qk_scale = d_qk / the model's own d_qk)")
    return float(d_qk) / model_d_qk(loaded)
