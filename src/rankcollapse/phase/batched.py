"""Many phase cells in one batched simulation.

Cells that share the tensor shapes and the block (``n_tokens, d_model, d_qk, depth,
mask, norm, placement, alpha, qk_norm, headwise_rmsnorm, input, attention``) differ only in their weights, so they run as one
batch: element ``b`` of the batch carries its own ``W_Q, W_K, W_V`` per layer and every
layer is one call of :func:`rankcollapse.dynamics.single_head.single_head_layer`, the
dynamics' fast path for one head without MLP (it agrees with
:func:`rankcollapse.dynamics.simulate` to round-off, cell by cell:
``tests/phase/test_phase_regime.py``).

Cells with more than :data:`.grid.DENSE_MAX_TOKENS` tokens (the axis's former cap, so every
cell that ran before runs as it did) go through
:func:`rankcollapse.dynamics.single_head.single_head_layer_blocked` instead: the windowed
kernel of :mod:`rankcollapse.dynamics.sparse`, whose attention memory is O(chunk N) for
the complete mask and O(edges) for sparse ones; each layer's ε, row entropy and row-mass
deficit are reduced chunk by chunk, so no ``(B, N, N)`` array is formed
(``tests/phase/test_phase_long.py`` checks the two paths agree).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np
import torch

from ..dynamics.layers import warn_zero_rows
from ..dynamics.chunks import chunk_threads
from ..dynamics.layer_weights import LayerWeights
from ..dynamics.single_head import single_head_layer, single_head_layer_blocked
from ..masks import parse_mask
from ..masks.graph import analyze
from ..metrics._context import evaluate
from ..metrics.attention import row_entropy
from ..metrics.registry import METRICS
from .grid import DENSE_MAX_TOKENS, attention_backend  # noqa: F401  (DENSE_MAX_TOKENS: re-exported)
from .cell import block_config, build_weights, make_input, operator_columns, value_log_norm
from .predict import _envelope, _envelope_columns, theory_prediction
from .regime import label_cell, trajectory_measures

#: the per-layer metrics of a trajectory, computed on one shared metric context per layer
LAYER_METRICS = {name: METRICS[name].fn for name in ("mu_relative", "mu", "avg_cos")}

#: the axes a batch must share
GROUP_KEYS = ("n_tokens", "d_model", "d_qk", "depth", "mask", "norm", "placement", "alpha", "input", "attention",
              "qk_norm", "headwise_rmsnorm")


def _stack(cells: list[dict[str, Any]], seeds: range, n_samples: int, depth: int):
    """Per-layer weights ``(depth, B, ...)`` with ``B = len(cells) * len(seeds) * samples``."""
    Q, K, V, scale = [], [], [], None
    for cell, s in itertools.product(cells, seeds):
        layers = build_weights(cell, s)
        scale = layers[0].scale
        for name, acc in (("W_Q", Q), ("W_K", K), ("W_V", V)):
            acc.append(torch.stack([getattr(lw, name) for lw in layers]) if len(layers) > 1 or depth == 1
                       else getattr(layers[0], name).expand(depth, *getattr(layers[0], name).shape))
    rep = lambda acc: torch.stack(acc, 1).repeat_interleave(n_samples, dim=1)  # noqa: E731
    return rep(Q), rep(K), rep(V), scale


def run_group(cells: list[dict[str, Any]], *, n_samples: int = 4, seeds: int = 1, seed: int = 0,
              backend: str = "auto") -> list[dict[str, Any]]:
    """The rows of ``cells`` (all equal on :data:`GROUP_KEYS`), same fields as
    :func:`.cell.run_cell`; ``backend`` as :func:`.grid.attention_backend` (the windowed kernel takes
    softmax attention only).

    Raises
    ------
    ConfigError, MaskError
        Cells that differ on a group key; a bad mask or input; an unknown ``backend``;
        an attention operator other than softmax on the blocked backend.
    """
    from ..errors import ConfigError

    first = cells[0]
    if any(c.get(k) != first.get(k) for c in cells for k in GROUP_KEYS):
        raise ConfigError(f"run_group needs cells equal on {GROUP_KEYS}")
    N, d, depth = first["n_tokens"], first["d_model"], first["depth"]
    mask = parse_mask(first["mask"], N)
    info = analyze(mask)
    blocked = attention_backend(N, backend) == "blocked"
    if blocked:
        from ..dynamics.runner import _plan
        from ..dynamics.sparse import DEFAULT_BLOCK_SIZE

        plan = _plan(mask, DEFAULT_BLOCK_SIZE, torch.device("cpu"))
    else:
        allowed = mask.to_dense()
    cfg = block_config(first)
    seed_range = range(seed, seed + seeds)
    X = torch.cat([make_input(first["input"], n_samples, N, d, s) for s in seed_range] * len(cells))
    WQ, WK, WV, scale = _stack(cells, seed_range, n_samples, depth)
    B = X.shape[0]
    m = evaluate(X, LAYER_METRICS)
    mus, mus_abs, ents, states = [m["mu_relative"]], [m["mu"]], [], {0: X}
    cosines = [m["avg_cos"]]  # the cosine gap's decay law (regime.law_measures)
    X0 = X
    diverged = torch.zeros(B, dtype=torch.bool)
    eps_min = torch.ones(B, dtype=torch.float64)
    deficit = torch.zeros(B, dtype=torch.float64)  # sum over layers of the mean row-mass deficit
    keep = {depth - max(1, depth // 10), depth}
    zero_rows = []
    with torch.no_grad(), (chunk_threads() if blocked else contextlib.nullcontext()):
        for t in range(depth):
            lw = LayerWeights(WQ[t], WK[t], WV[t], scale=scale)  # per sample: (B, d, d)
            if blocked:
                X, st, z = single_head_layer_blocked(X, plan, lw, cfg, layer=t + 1)
                ents.append(st["entropy"])
                eps_min = torch.minimum(eps_min, st["epsilon"])
                deficit += st["row_mass_deficit"]
            else:
                X, A, z = single_head_layer(X, allowed, lw, cfg, layer=t + 1)
                ents.append(row_entropy(A.unsqueeze(1), allowed))  # one head: (B, 1, N, N) -> (B,)
                eps_min = torch.minimum(eps_min, A.masked_fill(~allowed, 1.0).amin(dim=(-1, -2)))
                deficit += 1.0 - A.sum(-1).mean(-1)  # 0 for softmax rows (to round-off)
            zero_rows.append(z)
            diverged |= ~torch.isfinite(X).all(dim=(-1, -2))  # overflow: simulate() would raise
            X = torch.where(diverged[:, None, None], X0, X)  # keep NaN/Inf out of the other metrics
            m = evaluate(X, LAYER_METRICS)
            mus.append(torch.where(diverged, torch.ones((), dtype=X.dtype), m["mu_relative"]))
            mus_abs.append(m["mu"])
            cosines.append(m["avg_cos"])
            if t + 1 in keep:
                states[t + 1] = X
    warn_zero_rows([int(z) for z in zero_rows])  # the rule of dynamics.layers.sphere, as simulate
    metrics = {"mu_relative": torch.stack(mus), "avg_cos": torch.stack(cosines)}
    entropy = torch.stack(ents).numpy()
    # trajectory_measures reads only states[0], states[-1 - w] and states[-1]
    kept: list = [None] * (depth + 1)
    for t, S_t in states.items():
        kept[t] = S_t
    trs = trajectory_measures(metrics, kept, entropy)
    for b in np.nonzero(diverged.numpy())[0]:
        trs[b] = {"diverged": True}
    per = seeds * n_samples
    env = _envelope(first, info, torch.stack(mus_abs).numpy(), X0, eps_min.numpy(), diverged.numpy())
    out = []
    for i, cell in enumerate(cells):
        row = label_cell(trs[i * per:(i + 1) * per])
        e = float(eps_min[i * per:(i + 1) * per].min())
        row.update(radius=info.radius, qsc=bool(info.quasi_strongly_connected), epsilon_measured=e)
        row.update(operator_columns(X, deficit / depth, diverged, slice(i * per, (i + 1) * per)))
        row.update(_envelope_columns(env, slice(i * per, (i + 1) * per)))
        row["value_log_norm"] = value_log_norm(cell, seed_range)
        row.update(theory_prediction(cell, info, e, row["value_log_norm"]))
        out.append(row)
    return out

