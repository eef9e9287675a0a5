"""The mask comparison table: masks by radius and Theorem 1's predicted per-layer
contraction (spec.md §5.1).

The Theorem-1 quantities themselves (ε bound, per-layer factor, envelope, effective
radius) live in :mod:`rankcollapse.theory.envelope`. The names ``EXPONENTS``,
``log_contraction``, ``log10_layers_per_decade``, ``collapse_envelope`` and
``epsilon_lower_bound`` are re-exported here unchanged for existing callers; they are
deprecated in this module (import them from :mod:`rankcollapse.theory.envelope`).
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from ..theory.envelope import (  # noqa: F401  (deprecated re-exports, see the module docstring)
    EXPONENTS,
    collapse_envelope,
    epsilon_lower_bound,
    log10_layers_per_decade,
    log_contraction,
    mask_terms,
    predicted_rate,
)
from .spec import parse_mask

__all__ = ["EXPONENTS", "collapse_envelope", "compare_masks", "epsilon_lower_bound", "log10_layers_per_decade",
           "log_contraction"]


def compare_masks(
    specs: Sequence[str], n: int, *, d_qk: float = 1.0, token_norm: float = 1.0,
    weight_norm: float = 1.0, exponent: str = "t/r", max_memory: int | str | None = None,
) -> pd.DataFrame:
    """Table of masks by radius and predicted per-layer contraction.

    Columns: ``spec, n_tokens, n_edges, quasi_strongly_connected, n_centers, radius,
    max_in_degree, epsilon_bound, log10_factor, log10_layers_per_decade``. ``epsilon_bound`` is
    :func:`~rankcollapse.theory.envelope.epsilon_lower_bound` for each mask's own max
    in-degree; ``log10_factor`` is ``log10`` of ``(1 - eps^r)^(1/(k r))``
    (:func:`~rankcollapse.theory.envelope.predicted_rate`). Non-QSC masks get no rate
    (NaN): Theorem 1 gives no collapse to one token there. ``max_memory`` bounds each
    graph analysis (see :func:`~rankcollapse.masks.analyze`).

    Raises
    ------
    MaskError
        A bad spec. ConfigError: an unknown exponent, bad ``d_qk`` or norms.
    """
    from .graph import analyze

    rows = []
    for spec in specs:
        a = analyze(parse_mask(spec, n), max_memory=max_memory)
        rate = predicted_rate(mask_terms(a), d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm,
                              exponent=exponent)
        rows.append({
            "spec": a.spec, "n_tokens": a.n_tokens, "n_edges": a.n_edges,
            "quasi_strongly_connected": a.quasi_strongly_connected,
            "n_centers": len(a.centers), "radius": a.radius, "max_in_degree": a.in_degree["max"],
            "epsilon_bound": rate["epsilon_bound"],
            "log10_factor": math.nan if rate["log10_rate_per_layer"] is None else rate["log10_rate_per_layer"],
            "log10_layers_per_decade": math.nan if rate["log10_layers_per_decade"] is None
            else rate["log10_layers_per_decade"],
        })
    return pd.DataFrame(rows).astype({"radius": "Int64"})
