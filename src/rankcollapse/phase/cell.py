"""Run one phase cell: build X(0) and per-layer weights, call
:func:`rankcollapse.dynamics.simulate`, and reduce the trajectories to per-trajectory
measurements that :mod:`.regime` labels.

Weights (float64, drawn from :func:`rankcollapse.dynamics.weights.generator` streams
``(seed, layer, role)``):

- ``W_Q, W_K`` ``(d, d_qk)`` i.i.d. ``N(0, s^2/d)`` with ``s = qk_scale``; scores
  ``q k^T / sqrt(d_qk)`` (``s = 0``: uniform attention over each mask row);
- ``W_V`` ``(d, d)`` times ``value_scale`` (``a``): ``gaussian`` ``N(0, a^2/d)``;
  ``orthogonal`` ``a Q`` (Haar); ``near_identity`` ``a I + N(0, 0.1^2/d)``;
  ``constructed`` ``a diag(lambda)`` of :func:`rankcollapse.theory.equilibria.construction_eigenvalues`
  (rank ``min(d, N)``); ``pretrained`` ``a`` times the top-left ``(d, d)`` block of
  all-MiniLM-L6-v2's ``W_V`` of layer ``t mod 6``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from ..dynamics.config import BlockConfig
from ..dynamics.inputs import gaussian_tokens, hemisphere_tokens, sphere_tokens
from ..dynamics.weights import LayerWeights, generator, haar_orthogonal
from ..errors import ConfigError
from ..masks import parse_mask
from ..masks.graph import analyze
from ..metrics.attention import row_entropy
from .regime import trajectory_measures

NEAR_IDENTITY_NOISE = 0.1  # std * sqrt(d) of the noise added to a I (fixed, documented)


def block_config(cell: dict[str, Any]) -> BlockConfig:
    """The :class:`BlockConfig` of a cell: ``sphere_sqrtd`` is RMSNorm without affine
    (rows to norm ``sqrt(d)``, up to ``eps``); ``post`` without skip is the theory
    placement ``X <- norm(SA(X))``."""
    norm = "rmsnorm" if cell["norm"] == "sphere_sqrtd" else cell["norm"]
    alpha = 1.0 if cell["skip"] else 0.0
    if cell["placement"] == "post":
        placement = "post_ln" if cell["skip"] else "none"
    else:
        placement = "pre_ln"
    return BlockConfig(norm=norm, placement=placement, alpha=alpha)


@lru_cache(maxsize=1)
def _minilm_value_matrices() -> tuple[torch.Tensor, ...]:
    from ..dynamics.pretrained import extract_attention_weights
    from ..models.loading import load_model

    loaded = load_model("minilm")
    model = getattr(loaded, "model", loaded)
    return tuple(lw.W_V.detach().to(torch.float64).cpu() for lw in extract_attention_weights(model))


@lru_cache(maxsize=32)
def _base(seed: int, role: str, kind: str, n: int, rows: int, cols: int) -> torch.Tensor:
    """``(n, rows, cols)`` float64 draws of one weight role under ``seed``: standard
    Gaussians (``kind="normal"``) or Haar orthogonal matrices (``kind="haar"``). Shared by
    every cell with the same seed and shapes (common random numbers: cells that differ
    only in a scale see the same underlying draw). Read-only."""
    gen = generator(seed, 0, role)
    if kind == "haar":
        return haar_orthogonal(rows, gen, batch=(n,))
    return torch.randn(n, rows, cols, generator=gen, dtype=torch.float64)


def _values(cell: dict[str, Any], n: int, seed: int) -> torch.Tensor:
    """``(n, d, d)`` value matrices of the ``n`` drawn layers."""
    d, a, fam = cell["d_model"], float(cell["value_scale"]), cell["value"]
    if fam == "gaussian":
        return _base(seed, "W_V", "normal", n, d, d) * (a / math.sqrt(d))
    if fam == "orthogonal":
        return _base(seed, "W_V", "haar", n, d, d) * a
    if fam == "near_identity":
        noise = _base(seed, "W_V", "normal", n, d, d) * (NEAR_IDENTITY_NOISE / math.sqrt(d))
        return a * torch.eye(d, dtype=torch.float64) + noise
    if fam == "constructed":
        from ..theory.equilibria import construction_eigenvalues

        lam = construction_eigenvalues(d, min(d, cell["n_tokens"]))
        return (a * torch.diag(torch.as_tensor(lam, dtype=torch.float64))).expand(n, d, d)
    if fam == "pretrained":
        mats = _minilm_value_matrices()
        if d > min(mats[0].shape):
            raise ConfigError(f"value 'pretrained' has width {min(mats[0].shape)}, d_model={d} is larger")
        return a * torch.stack([mats[t % len(mats)][:d, :d] for t in range(n)])
    raise ConfigError(f"unknown value family {fam!r}")


def build_weights(cell: dict[str, Any], seed: int) -> list[LayerWeights]:
    """Per-layer float64 weights of ``cell`` under weight seed ``seed`` (module docstring);
    layer ``t`` uses slice ``t`` of each role's draw (:func:`_base`)."""
    d, depth = cell["d_model"], cell["depth"]
    d_qk = cell["d_qk"] or d
    n = 1 if cell["shared"] else depth
    std = float(cell["qk_scale"]) / math.sqrt(d)
    WQ = _base(seed, "W_Q", "normal", n, d, d_qk) * std
    WK = _base(seed, "W_K", "normal", n, d, d_qk) * std
    WV = _values(cell, n, seed)
    layers = [LayerWeights(W_Q=WQ[t], W_K=WK[t], W_V=WV[t].clone(), scale=1 / math.sqrt(d_qk)) for t in range(n)]
    return layers * depth if cell["shared"] else layers


def value_log_norm(cell: dict[str, Any], seeds: range) -> float:
    """``max`` over the weight seeds and over ``t = 0..depth`` of ``sum_{s<t} ln ||W_V(s)||_2``
    (the empty product counts, so the value is ``>= 0``): 0 means every partial product
    ``W_V(0)…W_V(t-1)`` has spectral norm at most 1 (Theorem 1's assumption A2 with
    constant 1, the form the envelope of docs/theory.md §1 needs)."""
    worst = 0.0
    for s in seeds:
        n = 1 if cell["shared"] else cell["depth"]
        logs = torch.log(torch.linalg.matrix_norm(_values(cell, n, s), ord=2))
        if cell["shared"]:
            logs = logs.expand(cell["depth"])
        worst = max(worst, float(torch.cumsum(logs, 0).max()))
    return worst


@lru_cache(maxsize=4)
def _minilm_tokens(n_tokens: int, batch: int) -> torch.Tensor:
    from ..sweep.context import RunContext, data_spec

    ctx = RunContext(data_spec(None, n_tokens, 0))
    return ctx.embeddings("minilm", batch).to(torch.float64)


def make_input(kind: str, batch: int, n_tokens: int, d: int, seed: int) -> torch.Tensor:
    """X(0) ``(batch, n_tokens, d)`` float64: ``gaussian`` N(0, 1); ``sphere`` uniform on
    the unit sphere; ``hemisphere`` uniform on an open hemisphere (Theorem 2's start);
    ``minilm``: all-MiniLM-L6-v2 embeddings of Wikipedia windows (window ``seed*batch``
    onward) projected on the top-``d`` right singular vectors of those tokens."""
    if kind == "gaussian":
        return gaussian_tokens(batch, n_tokens, d, seed=seed)
    if kind == "sphere":
        return sphere_tokens(batch, n_tokens, d, seed=seed)
    if kind == "hemisphere":
        return hemisphere_tokens(batch, n_tokens, d, seed=seed).to(torch.float64)
    if kind == "minilm":
        E = _minilm_tokens(n_tokens, batch * (seed + 1))[seed * batch:(seed + 1) * batch]
        if d > E.shape[-1]:
            raise ConfigError(f"input 'minilm' has width {E.shape[-1]}, d_model={d} is larger")
        _, _, Vh = torch.linalg.svd(E.reshape(-1, E.shape[-1]), full_matrices=False)
        return E @ Vh[:d].T
    raise ConfigError(f"unknown input {kind!r}")


def _entropy_per_layer(attention: list[torch.Tensor], allowed: torch.Tensor) -> np.ndarray:
    """``(depth, B)`` attention entropy of every layer (the registry's
    :func:`~rankcollapse.metrics.attention.row_entropy`: mean over heads and rows with
    > 1 allowed key of the row entropy divided by ``log(#allowed keys)``)."""
    return row_entropy(torch.stack(attention), allowed).numpy()  # (T, B, H, N, N) -> (T, B)


def _diverged_envelope(cell: dict[str, Any], info: Any, samples: int) -> dict[str, np.ndarray] | None:
    from .predict import envelope_applies

    if not envelope_applies(cell, info):
        return None
    return {"violations": np.full(samples, -1), "log10_margin": np.full(samples, np.nan), "layers": cell["depth"] + 1}


def _join(parts: list) -> dict[str, np.ndarray] | None:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    return {"violations": np.concatenate([p["violations"] for p in parts]),
            "log10_margin": np.concatenate([p["log10_margin"] for p in parts]), "layers": parts[0]["layers"]}


def run_cell(cell: dict[str, Any], *, samples: int = 4, seeds: int = 1, seed: int = 0) -> dict[str, Any]:
    """Simulate ``cell`` for ``seeds`` weight draws (``seed``, ``seed+1``, ...) with
    ``samples`` inputs each and return the cell's row (see :func:`.regime.label_cell`).

    Raises
    ------
    ConfigError, MaskError
        A cell the dynamics cannot run (missing axes, bad mask, width mismatch:
        :func:`.grid.check_cells`).
    MemoryLimitError
        The cell's :func:`.grid.cell_bytes` exceeds half the physical memory.
    """
    from ..dynamics import simulate
    from .predict import _envelope, _envelope_columns
    from .grid import check_cells
    from .regime import label_cell, theory_prediction

    check_cells([cell], samples)

    N, d = cell["n_tokens"], cell["d_model"]
    mask = parse_mask(cell["mask"], N)
    info = analyze(mask)
    cfg = block_config(cell)
    trajectories, envelopes = [], []
    eps_min = 1.0
    for s in range(seed, seed + seeds):
        X0 = make_input(cell["input"], samples, N, d, s)
        weights = build_weights(cell, s)
        try:
            res = simulate(X0, mask=mask, depth=cell["depth"], variant=cfg, weights=weights,
                           metrics=("mu_relative", "mu"), dtype=torch.float64,
                           record_states=True, record_attention=True, record_epsilon=True)
        except ConfigError as exc:
            if "non-finite" not in str(exc):
                raise
            trajectories += [{"diverged": True}] * samples
            envelopes.append(_diverged_envelope(cell, info, samples))
            continue
        ent = _entropy_per_layer(res.attention, mask.to_dense())
        eps_min = min(eps_min, float(res.epsilon.min()))
        trajectories += trajectory_measures(res.metrics, res.states, ent)
        dense = mask.to_dense()
        eps_b = torch.stack([A.masked_fill(~dense, 1.0).flatten(1).amin(1) for A in res.attention]).amin(0)
        envelopes.append(_envelope(cell, info, res.metrics["mu"].numpy(), X0, eps_b.numpy(),
                                   np.zeros(samples, dtype=bool)))
    row = label_cell(trajectories)
    row.update(radius=info.radius, qsc=bool(info.quasi_strongly_connected), epsilon_min=eps_min)
    row.update(_envelope_columns(_join(envelopes), slice(None)))
    row["value_log_norm"] = value_log_norm(cell, range(seed, seed + seeds))
    row.update(theory_prediction(cell, info, eps_min, row["value_log_norm"]))
    return row
