"""Many phase cells in one batched simulation.

Cells that share the tensor shapes and the block (``n_tokens, d_model, d_qk, depth,
mask, norm, placement, alpha, input``) differ only in their weights, so they run as one
batch: element ``b`` of the batch carries its own ``W_Q, W_K, W_V`` per layer and every
layer is a handful of batched matmuls instead of one :func:`rankcollapse.dynamics.simulate`
call per cell. The update is the one of :func:`rankcollapse.dynamics.layers.block_forward`
for a single head without MLP (tests check both paths agree to round-off):

- ``none``: ``X <- norm(A X W_V)``; ``post_ln``: ``X <- norm(alpha X + A X W_V)``;
- ``pre_ln``: ``X <- alpha X + A' Z W_V`` with ``Z = norm(X)`` and ``A'`` computed from ``Z``,

with ``A = softmax_G(X W_Q (X W_K)^T / sqrt(d_qk))`` (:func:`~rankcollapse.dynamics.attention.masked_softmax`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch

from ..dynamics.attention import masked_softmax
from ..dynamics.layers import apply_norm
from ..masks import parse_mask
from ..masks.graph import analyze
from ..metrics import mu, mu_relative
from ..metrics.attention import row_entropy
from .cell import block_config, build_weights, make_input, value_log_norm
from .predict import envelope_points, theory_prediction
from .regime import label_cell, trajectory_measures

#: the axes a batch must share
GROUP_KEYS = ("n_tokens", "d_model", "d_qk", "depth", "mask", "norm", "placement", "alpha", "input")


def _stack(cells: list[dict[str, Any]], seeds: range, samples: int, depth: int):
    """Per-layer weights ``(depth, B, ...)`` with ``B = len(cells) * len(seeds) * samples``."""
    Q, K, V, scale = [], [], [], None
    for cell, s in itertools.product(cells, seeds):
        layers = build_weights(cell, s)
        scale = layers[0].scale
        for name, acc in (("W_Q", Q), ("W_K", K), ("W_V", V)):
            acc.append(torch.stack([getattr(lw, name) for lw in layers]) if len(layers) > 1 or depth == 1
                       else getattr(layers[0], name).expand(depth, *getattr(layers[0], name).shape))
    rep = lambda acc: torch.stack(acc, 1).repeat_interleave(samples, dim=1)  # noqa: E731
    return rep(Q), rep(K), rep(V), scale


def envelope_applies(cell: dict[str, Any], info: Any) -> bool:
    """Theorem 1's envelope is defined for the cell: pure SA (no norm, no skip) on a
    quasi-strongly connected mask with self-loops. Whether it must hold also needs A2
    (``theory_source == "theorem1"``); outside A2 the check is computed all the same."""
    return (cell["norm"] == "none" and cell["placement"] == "none"
            and bool(info.quasi_strongly_connected) and bool(info.self_loops) and cell["n_tokens"] >= 2)


def _envelope(cell, info, mu_abs, X0, eps, diverged) -> dict[str, np.ndarray] | None:
    if not envelope_applies(cell, info):
        return None
    out = envelope_points(mu_abs, X0, eps, int(info.radius))
    out["layers"] = mu_abs.shape[0]
    out["violations"] = np.where(diverged, -1, out["violations"])  # -1: not checked (overflowed)
    return out


def _envelope_columns(env: dict[str, np.ndarray] | None, part: slice) -> dict[str, float]:
    """Per cell: ``envelope_points`` (layer × trajectory points checked), ``envelope_violations``
    and ``envelope_log10_margin`` (largest log10 μ/E over layers >= 1); NaN where the envelope
    is not defined."""
    if env is None:
        return {"envelope_points": 0, "envelope_violations": float("nan"), "envelope_log10_margin": float("nan")}
    v, m = env["violations"][part], env["log10_margin"][part]
    ok = v >= 0
    return {"envelope_points": int(ok.sum()) * int(env["layers"]), "envelope_violations": float(v[ok].sum()),
            "envelope_log10_margin": float(m[ok].max()) if ok.any() else float("nan")}


def run_group(cells: list[dict[str, Any]], *, samples: int = 4, seeds: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """The rows of ``cells`` (all equal on :data:`GROUP_KEYS`), same fields as
    :func:`.cell.run_cell`.

    Raises
    ------
    ConfigError, MaskError
        Cells that differ on a group key; a bad mask or input.
    """
    from ..errors import ConfigError

    first = cells[0]
    if any(c[k] != first[k] for c in cells for k in GROUP_KEYS):
        raise ConfigError(f"run_group needs cells equal on {GROUP_KEYS}")
    N, d, depth = first["n_tokens"], first["d_model"], first["depth"]
    mask = parse_mask(first["mask"], N)
    info = analyze(mask)
    allowed = mask.to_dense()
    cfg = block_config(first)
    seed_range = range(seed, seed + seeds)
    X = torch.cat([make_input(first["input"], samples, N, d, s) for s in seed_range] * len(cells))
    WQ, WK, WV, scale = _stack(cells, seed_range, samples, depth)
    B = X.shape[0]
    mus, mus_abs, ents, states = [mu_relative(X)], [mu(X)], [], {0: X}
    X0 = X
    diverged = torch.zeros(B, dtype=torch.bool)
    eps_min = torch.ones(B, dtype=torch.float64)
    keep = {depth - max(1, depth // 10), depth}
    with torch.no_grad():
        for t in range(depth):
            Z = apply_norm(X, cfg.norm, cfg.eps)[0] if cfg.placement == "pre_ln" else X
            S = (Z @ WQ[t]) @ (Z @ WK[t]).transpose(-1, -2) * scale
            A = masked_softmax(S, allowed)
            SA = A @ Z @ WV[t]
            if cfg.placement == "pre_ln":
                X = cfg.alpha * X + SA
            else:
                X = apply_norm(cfg.alpha * X + SA if cfg.alpha else SA, cfg.norm, cfg.eps)[0]
            diverged |= ~torch.isfinite(X).all(dim=(-1, -2))  # overflow: simulate() would raise
            X = torch.where(diverged[:, None, None], X0, X)  # keep NaN/Inf out of the other metrics
            ents.append(row_entropy(A.unsqueeze(1), allowed))  # one head: (B, 1, N, N) -> (B,)
            eps_min = torch.minimum(eps_min, A.masked_fill(~allowed, 1.0).amin(dim=(-1, -2)))
            mus.append(torch.where(diverged, torch.ones((), dtype=X.dtype), mu_relative(X)))
            mus_abs.append(mu(X))
            if t + 1 in keep:
                states[t + 1] = X
    metrics = {"mu_relative": torch.stack(mus)}
    entropy = torch.stack(ents).numpy()
    # trajectory_measures reads only states[0], states[-1 - w] and states[-1]
    kept: list = [None] * (depth + 1)
    for t, S_t in states.items():
        kept[t] = S_t
    trs = trajectory_measures(metrics, kept, entropy)
    for b in np.nonzero(diverged.numpy())[0]:
        trs[b] = {"diverged": True}
    per = seeds * samples
    env = _envelope(first, info, torch.stack(mus_abs).numpy(), X0, eps_min.numpy(), diverged.numpy())
    out = []
    for i, cell in enumerate(cells):
        row = label_cell(trs[i * per:(i + 1) * per])
        e = float(eps_min[i * per:(i + 1) * per].min())
        row.update(radius=info.radius, qsc=bool(info.quasi_strongly_connected), epsilon_min=e)
        row.update(_envelope_columns(env, slice(i * per, (i + 1) * per)))
        row["value_log_norm"] = value_log_norm(cell, seed_range)
        row.update(theory_prediction(cell, info, e, row["value_log_norm"]))
        out.append(row)
    return out
