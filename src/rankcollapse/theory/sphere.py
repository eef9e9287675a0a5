"""Theorem 2 (spec.md §5.2; docs/theory.md §2): under a QSC mask and per-layer Haar-orthogonal
``W_V``, SA-LN tokens with non-negative pairwise cosines converge to one point (``μ → 0``);
antipodal inputs keep ``μ`` away from 0 under sharp attention."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._display import NotebookResult
from .._memory import check_memory
from ..dynamics.inputs import ON_SPHERE, canonical_input, make_tokens, seeded_generator
from ..dynamics.layer_weights import LayerWeights
from ..dynamics.single_head import single_head_layer
from .._validate import Spec
from ..errors import ConfigError
from ..metrics import mu as mu_metric
from ..dynamics.weights import haar_orthogonal
from ..masks import resolve_mask
from .bound import fit_rate
from .system import SA_LN

#: the inputs the check runs by default: meeting Theorem 2's condition, violating it, and neither
INPUTS = ("nonnegative", "antipodal", "sphere")


def make_inputs(kind: str, n_samples: int, n_tokens: int, d_model: int, generator: torch.Generator) -> torch.Tensor:
    """Unit tokens ``(n_samples, n_tokens, d_model)`` float64 of the input ``kind``
    (:func:`rankcollapse.dynamics.inputs.make_tokens`) drawn from ``generator``. Raises
    ConfigError unless ``kind`` is in :data:`~rankcollapse.dynamics.inputs.ON_SPHERE`."""
    if Spec.name_of(canonical_input(kind)) not in ON_SPHERE:
        raise ConfigError(f"inputs must be one on the unit sphere, one of {ON_SPHERE}, got {kind!r}")
    return make_tokens(kind, n_samples, n_tokens, d_model, generator=generator)


@dataclass
class SphereResult(NotebookResult):
    """μ per layer ``(depth+1, B)``, min pairwise cosine at t=0, fitted rate, and final μ."""

    mask: str
    inputs: str
    mu: torch.Tensor
    min_cos0: float
    measured_rate: float
    final_mu: float
    collapsed: bool
    config: dict[str, Any]

    def to_pandas(self) -> Any:
        """Tidy :class:`pandas.DataFrame` ``layer, sample, mu``."""
        import pandas as pd

        T, B = self.mu.shape
        return pd.DataFrame({"layer": np.repeat(np.arange(T), B), "sample": np.tile(np.arange(B), T),
                             "mu": self.mu.flatten().numpy()})

    def to_dict(self) -> dict[str, Any]:
        return {"mask": self.mask, "inputs": self.inputs, "min_cos0": self.min_cos0,
                "measured_rate": self.measured_rate, "final_mu_median": self.final_mu,
                "collapsed": self.collapsed, "mu_median": self.mu.median(dim=1).values.tolist(),
                "config": self.config}


def check_sphere_collapse(mask: Any, *, n_tokens: int | None = None, d_model: int = 8, depth: int = 80,
                          n_samples: int = 8, inputs: str = "nonnegative", seed: int = 0, beta: float = 1.0,
                          collapse_tol: float = 1e-8) -> SphereResult:
    """Run SA-LN ``X ↦ D A X W_V(t)`` with Haar-orthogonal ``W_V(t)`` and measure collapse.

    Scores ``β ⟨x_i, x_j⟩`` (``W_Q = W_K = sqrt(beta) I``, ``d_qk = 1``); ``collapsed`` iff the
    median final ``μ`` is below ``collapse_tol``. Raises ConfigError for unknown ``inputs``, N < 2,
    d < 2, depth or n_samples < 1, beta < 0, or a zero row of ``A X W_V`` at some layer.
    """
    m, d = resolve_mask(mask, n_tokens), d_model  # d: the formulas' name for d_model
    N = m.n_tokens
    if N < 2 or d < 2 or depth < 1 or n_samples < 1 or not beta >= 0:
        raise ConfigError(f"need N ≥ 2 tokens, d_model ≥ 2, depth ≥ 1, n_samples ≥ 1 and beta ≥ 0; got N={N}, d_model={d}, "
                          f"depth={depth}, n_samples={n_samples}, beta={beta}")
    # W_V of every layer, the mask, and per layer the scores and weights (B, N, N) and token copies (B, N, d)
    check_memory(8 * (depth * d * d + N * N + 4 * n_samples * N * N + 6 * n_samples * N * d),
                 f"the sphere check of {n_samples} x {N} x {d} tokens over {depth} layers", adjustable=False)
    g = seeded_generator(seed)
    X = make_inputs(inputs, n_samples, N, d, g)
    cos0 = float((X @ X.transpose(1, 2)).amin())
    W_V = haar_orthogonal(d, g, batch=(depth,))
    W = math.sqrt(beta) * torch.eye(d, dtype=torch.float64)
    dense = m.to_dense()
    mus = [mu_metric(X)]
    for t in range(depth):  # loop over layers only
        try:
            X = single_head_layer(X, dense, LayerWeights(W, W, W_V[t]), SA_LN, d_qk=1.0, zero_rows="raise")[0]
        except ConfigError as exc:  # the one zero-row rule (dynamics.layers.sphere), named by layer
            raise ConfigError(f"layer {t}: {exc}") from None
        mus.append(mu_metric(X))
    mu_t = torch.stack(mus)
    final = float(mu_t[-1].median())
    cfg = {"n_tokens": N, "d_model": d, "depth": depth, "n_samples": n_samples, "seed": seed, "beta": beta}
    return SphereResult(m.spec, inputs, mu_t, cos0, float(fit_rate(mu_t).median()), final,
                        final < collapse_tol, cfg)
