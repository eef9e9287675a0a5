"""Many phase cells, equal on :data:`GROUP_KEYS`, in one batched simulation through the
dynamics' one-head path (:func:`rankcollapse.dynamics.single_head.single_head_layer`; above
:data:`.grid.DENSE_MAX_TOKENS` tokens the windowed kernel), each element with its own
weights; layers are measured in chunks of :data:`MEASURE_BYTES`, sample by sample.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import warnings
from typing import Any, Callable

import numpy as np
import torch

from ..dynamics.layers import warn_zero_rows
from ..dynamics.chunks import chunk_threads
from ..dynamics.layer_weights import LayerWeights
from ..dynamics.runner import _metric_fn, _peak, _plan
from ..dynamics.sparse import DEFAULT_BLOCK_SIZE
from ..dynamics.single_head import single_head_layer, single_head_layer_blocked
from ..masks import parse_mask
from ..masks.graph import analyze
from ..errors import ConfigError, MetricError
from ..metrics import compute_metrics
from ..metrics._context import ZeroRowWarning
from ..metrics.attention import row_entropy
from .grid import DEFAULTS, DENSE_MAX_TOKENS, attention_backend  # noqa: F401  (DENSE_MAX_TOKENS: re-exported)
from .cell import (block_config, make_input, operator_columns, sink_columns, sink_mass, uniform_sink_mass,
                   value_log_norm, weight_stack)
from .predict import _envelope, _envelope_columns, theory_prediction
from .regime import label_cell, trajectory_measures

#: the per-layer metrics of a trajectory, as ``simulate``'s layer loop records them
LAYER_METRICS = ("mu_relative", "mu", "avg_cos")

#: the axes a batch must share
GROUP_KEYS = ("n_tokens", "d_model", "d_qk", "depth", "mask", "norm", "placement", "alpha", "input", "attention",
              "qk_norm", "headwise_rmsnorm")

#: bytes of the attention (at least of the states) of the layers measured at once: about half an L2
#: cache, at most the metrics' :data:`~rankcollapse.metrics._context.PAIR_BUDGET` (one layer's path)
MEASURE_BYTES = 2**20


def _state_measure():
    """``measure(X) -> {name: (B,)}`` of :data:`LAYER_METRICS` on ``X`` ``(B, N, d)`` as ``simulate``'s."""
    _, measure, _ = _metric_fn(LAYER_METRICS)
    return lambda X: measure(X, None, _peak(X))


def _measure(metrics, Xs: list[torch.Tensor], As: list, allowed: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``(T, B)`` :data:`LAYER_METRICS` of outputs ``Xs``; ``entropy``, ``epsilon``, ``row_mass_deficit`` of
    attention ``As`` (dense under ``allowed``; with ``allowed`` None the windowed kernel's row statistics)."""
    T = len(Xs)
    out = {k: v.reshape(T, -1) for k, v in metrics(torch.stack(Xs).flatten(0, 1)).items()}
    if allowed is None:
        out.update({k: torch.stack([st[k] for st in As]) for k in ("entropy", "epsilon", "row_mass_deficit")})
        return out
    A = torch.stack(As)  # (T, B, N, N)
    out["entropy"] = row_entropy(A.unsqueeze(2), allowed)  # one head: (T, B, 1, N, N) -> (T, B)
    # masked weights are exactly 0 (every operator's): 1 there, the same bits as masked_fill
    out["epsilon"] = (A if bool(allowed.all()) else A + (~allowed).to(A.dtype)).amin(dim=(-1, -2))
    out["row_mass_deficit"] = 1.0 - A.sum(-1).mean(-1)  # 0 for softmax rows (to round-off)
    return out


def cell_name(cell: dict[str, Any]) -> str:
    """``phase cell value_scale=0.0, depth=3``: the axes that differ from their defaults."""
    axes = ", ".join(f"{k}={cell[k]}" for k, v in DEFAULTS.items() if cell.get(k) not in (None, v))
    return f"phase cell {axes or 'of the default axes'}"


class _Located:
    """Per-layer measures of a batch of cells; a failing cell, layer and sample named; zero tokens per cell."""

    def __init__(self, cells: list[dict[str, Any]], seeds: range, n_samples: int) -> None:
        self.cells, self.seeds, self.n_samples = cells, seeds, n_samples
        self.per = len(seeds) * n_samples  # trajectories per cell
        self.zero = torch.zeros(len(cells) * len(seeds) * n_samples, dtype=torch.int64)

    def __call__(self, measure: Callable[[], dict], Xs: list[torch.Tensor], first: int) -> dict:
        """``measure()`` of the states ``Xs`` ``(B, N, d)`` of layers ``first, first + 1, ...``."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = measure()
            except MetricError as exc:  # name the first cell, layer and sample that fails
                for k, b in itertools.product(range(len(Xs)), range(len(self.zero))):
                    try:
                        compute_metrics(Xs[k][b], LAYER_METRICS)
                    except MetricError as one:
                        seed = self.seeds[b % self.per // self.n_samples]
                        raise MetricError(f"{cell_name(self.cells[b // self.per])} (seed {seed}, sample "
                                          f"{b % self.n_samples}), layer {first + k}: {one}") from None
                raise exc from None
        for w in caught:
            if issubclass(w.category, ZeroRowWarning):  # once per call: counted here per element
                self.zero += (torch.stack(Xs) == 0).all(-1).sum(dim=(0, 2))
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return out

    def warn(self) -> None:
        for i, cell in enumerate(self.cells):
            n = int(self.zero[i * self.per:(i + 1) * self.per].sum())
            if n:
                warnings.warn(f"{cell_name(cell)}: {n} zero token(s) over its layers and samples have no direction; "
                              "they are excluded from cosine metrics", ZeroRowWarning, stacklevel=4)


def _stack(cells: list[dict[str, Any]], seeds: range, n_samples: int, depth: int):
    """Per-layer weights ``(depth, B, ...)``, ``B`` ordered by cell, seed, sample, and the score scale."""
    Q, K, V, scale = [], [], [], None
    for cell, s in itertools.product(cells, seeds):
        *roles, scale = weight_stack(cell, s)
        for W, acc in zip(roles, (Q, K, V)):  # (1 or depth, ...) -> (depth, n_samples, ...)
            acc.append(W.expand(depth, *W.shape[1:]).unsqueeze(1).expand(-1, n_samples, -1, -1))
    return torch.cat(Q, 1), torch.cat(K, 1), torch.cat(V, 1), scale


def run_group(cells: list[dict[str, Any]], *, n_samples: int = 4, seeds: int = 1, seed: int = 0,
              backend: str = "auto") -> list[dict[str, Any]]:
    """The rows of ``cells`` (all equal on :data:`GROUP_KEYS`) as :func:`.cell.run_cell`;
    ``backend`` as :func:`.grid.attention_backend`. :class:`ConfigError` or :class:`MaskError`
    for cells that differ on a group key, a bad mask, input or ``backend``."""
    first = cells[0]
    if any(c.get(k) != first.get(k) for c in cells for k in GROUP_KEYS):
        raise ConfigError(f"run_group needs cells equal on {GROUP_KEYS}")
    N, d, depth = first["n_tokens"], first["d_model"], first["depth"]
    mask = parse_mask(first["mask"], N)
    info = analyze(mask)
    blocked = attention_backend(N, backend) == "blocked"
    if blocked:
        plan = _plan(mask, DEFAULT_BLOCK_SIZE, torch.device("cpu"))
        uniform = float("nan")  # sink_mass: dense cells only
    else:
        allowed = mask.to_dense()
        uniform = uniform_sink_mass(allowed)
    cfg = block_config(first)
    seed_range = range(seed, seed + seeds)
    X = torch.cat([make_input(first["input"], n_samples, N, d, s) for s in seed_range] * len(cells))
    WQ, WK, WV, scale = _stack(cells, seed_range, n_samples, depth)
    B, X0 = X.shape[0], X
    diverged = torch.zeros(B, dtype=torch.bool)
    overflowed = False  # diverged.any(), kept on the host
    diverged_at = torch.full((B,), depth + 1)  # the layer whose output first overflowed
    keep = {depth - max(1, depth // 10), depth}
    states, zero_rows = [X] + [None] * depth, []  # trajectory_measures reads states 0, -1 - w and -1
    metrics = _state_measure()
    located = _Located(cells, seed_range, n_samples)
    chunks = [located(lambda: {k: v[None] for k, v in metrics(X).items()}, [X], 0)]  # X(0); then each chunk's layers
    size = max(1, MEASURE_BYTES // (B * N * max(N, d) * X.element_size()))  # layers measured at once
    sink = torch.full((B,), float("nan"), dtype=torch.float64)  # the last layer's first-token mass
    Xs, As = [], []  # the outputs and attention of the chunk's layers, measured at once (_measure)
    with torch.no_grad(), (chunk_threads() if blocked else contextlib.nullcontext()):
        for t, (W_Q, W_K, W_V) in enumerate(zip(WQ.unbind(), WK.unbind(), WV.unbind())):
            lw = LayerWeights(W_Q, W_K, W_V, scale=scale)  # per sample: (B, d, d)
            if blocked:
                X, st, z = single_head_layer_blocked(X, plan, lw, cfg, layer=t + 1)
                As.append(st)
            else:
                X, A, z = single_head_layer(X, allowed, lw, cfg, layer=t + 1)
                As.append(A)
                if t + 1 == depth:
                    sink = sink_mass(A)  # (B,)
            zero_rows.append(z)
            # overflow (simulate() would raise): a NaN or Inf in X makes its sum non-finite (a finite X
            # whose sum overflows finds no sample diverged below)
            if overflowed or not math.isfinite(float(X.sum())):
                bad = ~torch.isfinite(X).all(dim=(-1, -2))
                diverged_at = torch.where(bad & ~diverged, t + 1, diverged_at)
                diverged |= bad
                overflowed = bool(diverged.any())
                X = torch.where(diverged[:, None, None], X0, X)  # keep NaN/Inf out of the other metrics
            Xs.append(X)
            if t + 1 in keep:
                states[t + 1] = X
            if len(Xs) == size or t + 1 == depth:
                chunks.append(located(lambda: _measure(metrics, Xs, As, None if blocked else allowed), Xs, t + 2 - len(Xs)))
                Xs, As = [], []
    warn_zero_rows([int(z) for z in zero_rows])  # the rule of dynamics.layers.sphere, as simulate
    located.warn()
    per_layer = {k: torch.cat([c[k] for c in chunks if k in c]) for k in chunks[-1]}  # (depth [+ 1], B) each
    eps_min = torch.minimum(torch.ones(B, dtype=torch.float64), per_layer["epsilon"].amin(0))
    deficit = torch.cumsum(per_layer["row_mass_deficit"], 0)[-1]  # summed layer by layer, in order
    after = torch.arange(depth + 1)[:, None] >= diverged_at  # (depth + 1, B): the state is X(0) of an overflow
    metrics = {"mu_relative": torch.where(after, torch.ones((), dtype=X.dtype), per_layer["mu_relative"]),
               "avg_cos": per_layer["avg_cos"]}
    trs = trajectory_measures(metrics, states, per_layer["entropy"].numpy())
    for b in np.nonzero(diverged.numpy())[0]:
        trs[b] = {"diverged": True}
    per = seeds * n_samples
    env = _envelope(first, info, per_layer["mu"].numpy(), X0, eps_min.numpy(), diverged.numpy())
    out = []
    for i, cell in enumerate(cells):
        part = slice(i * per, (i + 1) * per)
        row = label_cell(trs[part])
        e = float(eps_min[part].min())
        row.update(radius=info.radius, qsc=bool(info.quasi_strongly_connected), epsilon_measured=e)
        row.update(operator_columns(X, deficit / depth, diverged, part))
        row.update(sink_columns(sink, diverged, part, uniform))
        row.update(_envelope_columns(env, part))
        row["value_log_norm"] = value_log_norm(cell, seed_range)
        row.update(theory_prediction(cell, info, e, row["value_log_norm"]))
        out.append(row)
    return out

