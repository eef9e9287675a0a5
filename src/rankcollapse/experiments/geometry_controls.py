"""Synthetic token matrices with a massive row, the controls of the geometry claims
(docs/reproduce.md, "Geometry claims"), measured with the probe's registry metrics
(:data:`GEOMETRY_METRICS`).

A Gaussian bulk with its last coordinate zero (seed per sample) and row 0 replaced by
``r * m * e_d`` (m the other rows' median norm): orthogonal to every other row, so
``max_token_sigma_share = 1`` once ``r m`` exceeds the bulk's σ₁.

- ``massive_spike``: r = 10, 100, 1000, 10000 at layers 0..3;
- ``massive_clipped``: the same with row 0 scaled to the median norm (``--clip-massive``);
- ``massive_null``: r = 20, 40, 10, 30: Spearman's ρ(ratio, layer) = 0 exactly;
- ``massive_aligned``: rows 1..N-1 equal to ``e_1`` and row 0 ``10.5 e_d``: the largest
  row explains ``110.25 / 127 = 0.868`` of σ₁² (below 0.9 by construction).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from .table import rows_from_metrics

GEOMETRY_METRICS = ("max_norm_ratio", "max_token_sigma_share", "matrix_entropy", "effective_rank")
SPIKE_RATIOS = (10.0, 100.0, 1000.0, 10000.0)
NULL_RATIOS = (20.0, 40.0, 10.0, 30.0)
ALIGNED_RATIO = 10.5


def _bulk(n_tokens: int, d_model: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(n_tokens, d_model, generator=g, dtype=torch.float64)
    B[:, -1] = 0.0
    return B


def _with_row0(B: torch.Tensor, ratio: float | None) -> torch.Tensor:
    """``B`` with row 0 set to ``ratio * median(other norms) * e_d`` (None: clipped to it)."""
    X = B.clone()
    median = torch.quantile(B[1:].norm(dim=-1), 0.5)
    if ratio is None:
        X[0] = B[0] * (median / B[0].norm())
    else:
        X[0] = 0.0
        X[0, -1] = ratio * median
    return X


def _measure(per_layer: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{metric: (L, B)}`` of ``per_layer[l] (B, N, d)``."""
    from ..metrics import compute_metrics

    vals = [compute_metrics(X, GEOMETRY_METRICS) for X in per_layer]
    return {m: torch.stack([v[m] for v in vals]) for m in GEOMETRY_METRICS}


def _series(p: dict[str, Any], ratios: tuple[float | None, ...]) -> pd.DataFrame:
    n, d, k = int(p.get("n_tokens", 128)), int(p.get("d_model", 64)), int(p.get("example_samples", 4))
    seed = int(p.get("seed_theory", 0))
    bulks = [_bulk(n, d, seed + s) for s in range(k)]
    per_layer = [torch.stack([_with_row0(B, r) for B in bulks]) for r in ratios]
    return rows_from_metrics(_measure(per_layer), {})


def rows_massive_spike(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """A massive row growing with depth: the geometry effects certainly present."""
    return _series(p, SPIKE_RATIOS)


def rows_massive_clipped(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """``massive_spike`` with the massive row clipped to the median norm."""
    return _series(p, (None,) * len(SPIKE_RATIOS))


def rows_massive_null(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """A massive row whose ratio has Spearman ρ = 0 with the layer index."""
    return _series(p, NULL_RATIOS)


def rows_massive_aligned(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """A row 10.5x the median norm that explains only 0.868 of sigma_1^2."""
    n, k = int(p.get("n_tokens", 128)), int(p.get("example_samples", 4))
    d = int(p.get("d_model", 64))
    X = torch.zeros(n, d, dtype=torch.float64)
    X[1:, 0] = 1.0
    X[0, -1] = ALIGNED_RATIO
    per_layer = [X.expand(k, n, d).clone() for _ in SPIKE_RATIOS]
    return rows_from_metrics(_measure(per_layer), {})
