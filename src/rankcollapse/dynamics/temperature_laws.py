"""Attention temperature laws: the inverse temperature ``β`` of scores ``β <q, k>`` as a function
of the number of keys ``N`` and the width ``d`` (docs/phase.md, "Temperature laws", gives each
law's source).

A law is a string, the one syntax of ``phase``'s ``beta`` axis and of ``rankcollapse theory
temperature``: ``log:γ`` (``γ ln N``), ``pow:c`` (``c N^{2/(d-1)}``), ``ssmax:s`` (``s ln N /
sqrt(d)``) or ``llama4`` (``(1 + 0.1 ln(1 + floor((p + 1) / 8192))) / sqrt(d)`` at query position ``p``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._validate import Key, Spec
from ..errors import ConfigError

LAWS: dict[str, tuple[Key, ...]] = {"log": (Key("gamma"),), "pow": (Key("c"),), "ssmax": (Key("s"),), "llama4": ()}
#: Llama 4's ``floor_scale`` and ``attn_scale`` (transformers ``Llama4TextConfig`` defaults)
LLAMA4_FLOOR_SCALE = 8192
LLAMA4_ATTN_SCALE = 0.1


@dataclass(frozen=True)
class TemperatureLaw:
    """A temperature law: ``name`` in :data:`LAWS` and its parameter (None for ``llama4``)."""

    name: str
    value: float | None = None

    @property
    def spec(self) -> str:
        """The canonical string: ``log:2.0``, ``pow:1.0``, ``ssmax:0.5``, ``llama4``."""
        return self.name if self.value is None else f"{self.name}:{self.value!r}"

    def beta(self, n_tokens: int, d_model: int, position: int | None = None) -> float:
        """``β`` of scores ``β <q, k>`` for a query at ``position`` (0-based; default
        ``n_tokens - 1``, the last) over ``n_tokens`` keys of width ``d_model``. Raises
        ``ConfigError``: ``n_tokens < 1``, ``d_model < 1``, ``pow`` with ``d_model < 2``, a negative
        position."""
        if n_tokens < 1 or d_model < 1:
            raise ConfigError(f"a temperature law needs n_tokens >= 1 and d_model >= 1, got {n_tokens}, {d_model}")
        if self.name == "log":
            return self.value * math.log(n_tokens)
        if self.name == "pow":
            if d_model < 2:
                raise ConfigError(f"{self.spec}: β = c N^(2/(d-1)) needs d_model >= 2, got {d_model}")
            return self.value * n_tokens ** (2.0 / (d_model - 1))
        if self.name == "ssmax":
            return self.value * math.log(n_tokens) / math.sqrt(d_model)
        p = n_tokens - 1 if position is None else position
        if p < 0:
            raise ConfigError(f"position must be >= 0, got {p}")
        return llama4_scale(p) / math.sqrt(d_model)

    def varies_with_position(self, n_tokens: int) -> bool:
        """True when queries at positions ``0..n_tokens-1`` get different ``β``."""
        return self.name == "llama4" and n_tokens >= LLAMA4_FLOOR_SCALE


def llama4_scale(position: int) -> float:
    """``log1p(floor((position + 1) / 8192)) * 0.1 + 1``: Llama 4's query scale at ``position`` (0-based)."""
    return math.log1p(math.floor((position + 1) / LLAMA4_FLOOR_SCALE)) * LLAMA4_ATTN_SCALE + 1.0


def is_law(text: object) -> bool:
    """True when ``text`` is written as a law (``NAME:value`` or a preset name), not as a number."""
    return isinstance(text, str) and (":" in text or text in LAWS)


def parse_law(text: str) -> TemperatureLaw:
    """The law written ``text``: ``log:γ``, ``pow:c``, ``ssmax:s`` (finite, ``>= 0``) or ``llama4``.
    Raises ``ConfigError``: an unknown law name, a missing, extra, negative or non-finite
    parameter."""
    law = Spec.parse(text, "temperature law", names=LAWS, short=True)
    value = next(iter(law.params.values()), None)
    if value is not None and value < 0:
        raise ConfigError(f"temperature law {text!r}: its parameter must be >= 0, got {value!r}")
    return TemperatureLaw(law.name, value)
