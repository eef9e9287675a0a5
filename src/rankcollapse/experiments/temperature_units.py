"""Participation ratio against the number of keys as table rows: the ``temperature_law``
unit kind of the temperature-law experiment (``configs/laws.yaml``, docs/phase.md,
"Temperature laws").

One unit is one law (``law``, a :mod:`rankcollapse.dynamics.temperature_laws` spec) at one
width ``d_model`` over the key counts ``n_tokens`` (powers of ten):
:func:`rankcollapse.theory.temperature.participation_scan` with ``keys`` (default
``sphere``), ``query`` (default ``fresh``), ``n_queries`` (the scale's) and ``draw_seed`` (default 0;
``seed`` is the weight seed of the tables, -1 here: no weights are drawn).
Rows: metric ``participation_ratio`` at ``layer = log10 N`` (so a fitted per-layer
``rate`` is the factor by which the mean PR grows per decade of N, ``10^exponent``), the
per-query values kept (a claim's bootstrap resamples the queries), ``point =
"n_tokens.N"``.

Labels: ``source = temperature_law``, ``model`` = the keys' input name, ``variant =
"LAW,d=D"`` (the law's canonical spec), ``mask = complete``, ``dtype = float64``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..sweep.units import register_unit_kind
from .units import key_params
from .table import normalise, rows_from_metrics
from .units import _labels


def law_variant(law: str, d_model: int) -> str:
    """``variant`` of a unit: ``"pow:1.0,d=3"`` (the law's canonical spec)."""
    from ..dynamics.temperature_laws import parse_law

    return f"{parse_law(str(law)).spec},d={int(d_model)}"


def _decades(sizes: list[int]) -> list[int]:
    """``log10 N`` of each N, refusing an N that is not a power of ten."""
    out = []
    for n in sizes:
        k = round(math.log10(n)) if n > 0 else -1
        if k < 1 or 10**k != n:
            raise ConfigError(f"temperature_law n_tokens must be powers of ten >= 10 (a layer is a decade), got {n}")
        out.append(k)
    return out


def temperature_law_rows(p: dict[str, Any]) -> pd.DataFrame:
    """Rows of one ``temperature_law`` unit (module docstring) from its parameters."""
    from ..theory.temperature import participation_scan

    sizes = [int(n) for n in p["n_tokens"]]
    layers = _decades(sizes)
    scan = participation_scan([str(p["law"])], sizes, keys=str(p.get("keys", "sphere")), d_model=int(p["d_model"]),
                              n_queries=int(p["n_queries"]), query=str(p.get("query", "fresh")),
                              seed=int(p.get("draw_seed", 0)))
    spec = scan.config["laws"][0]
    values = np.stack([scan.per_query[(n, spec)] for n in sizes])  # (L, n_queries)
    return rows_from_metrics({"participation_ratio": values}, {}, layers=layers,
                             points=[f"n_tokens.{n}" for n in sizes])


def run_temperature_law(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``temperature_law`` unit kind (module docstring)."""
    p = unit.params
    labels = _labels(unit, model=str(p.get("keys", "sphere")), variant=law_variant(p["law"], p["d_model"]),
                     mask="complete", mask_spec="complete", dtype="float64")
    return normalise(temperature_law_rows(p), labels)


# Registered with the sweep engine beside the other experiment kinds (schema.py imports
# this module); the version is bumped when a change alters these units' labels or numbers.
register_unit_kind("temperature_law", run_temperature_law, version=1, group="experiments", key_params=key_params)
