"""Run one phase cell through :func:`rankcollapse.dynamics.simulate` with its float64 weights
(docs/phase.md, "Axes": ``W_Q, W_K`` i.i.d. ``N(0, s^2/d)``, or ``W_K = I``, ``W_Q = β sqrt(d) I``
for scores ``β <x_i, x_j>``; ``W_V`` of the ``value`` family times ``value_scale``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from .._validate import Spec
from ..dynamics import RunConfig, simulate
from ..dynamics.inputs import canonical_input, make_tokens
from ..dynamics.weights import LayerWeights, draw, generator
from ..errors import ConfigError
from ..masks import parse_mask
from ..masks.graph import analyze
from ..metrics.attention import row_entropy
from ..metrics.core import max_token_share
from ..models.sinks import first_token_mass
from .grid import DENSE_MAX_TOKENS, block_config, cell_beta, check_cells
from .predict import _envelope, _envelope_columns, envelope_applies
from .regime import label_cell, theory_prediction, trajectory_measures

NEAR_IDENTITY_NOISE = 0.1  # std * sqrt(d) of the noise added to a I
#: value family -> its registry parameters for the value scale ``a`` of ``cell`` (W_V = draw(family, **params))
_VALUE_PARAMS = {
    "gaussian": lambda a, cell: {"std": a / math.sqrt(cell["d_model"])},
    "orthogonal": lambda a, cell: {"scale": a},
    "near_identity": lambda a, cell: {"scale": a, "noise": NEAR_IDENTITY_NOISE},
    "constructed": lambda a, cell: {"scale": a, "rank": min(cell["d_model"], cell["n_tokens"])},
    "pretrained": lambda a, cell: {"scale": a},
}


@lru_cache(maxsize=32)
def _draw(seed: int, role: str, family: str, params: tuple, n: int, rows: int, cols: int) -> torch.Tensor:
    """Read-only float64 ``(n, rows, cols)`` of ``family`` from the stream ``(seed, 0, role)``."""
    return draw(family, rows, cols, generator(seed, 0, role), n=n, role=role, **dict(params))


def _values(cell: dict[str, Any], n: int, seed: int) -> torch.Tensor:
    d, fam = cell["d_model"], cell["value"]
    if fam not in _VALUE_PARAMS:
        raise ConfigError(f"unknown value family {fam!r}")
    params = _VALUE_PARAMS[fam](float(cell["value_scale"]), cell)
    return _draw(seed, "W_V", fam, tuple(sorted(params.items())), n, d, d)


def weight_stack(cell: dict[str, Any], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """``(W_Q, W_K, W_V, scale)`` of ``cell`` under weight seed ``seed``: read-only float64
    ``(n, d, d_qk)``, ``(n, d, d_qk)``, ``(n, d, d)`` (``n = 1`` when ``shared``, else
    ``depth``) and the score scale ``1 / sqrt(d_qk)``."""
    d, depth = cell["d_model"], cell["depth"]
    d_qk = cell["d_qk"] or d
    n = 1 if cell["shared"] else depth
    beta = cell_beta(cell)
    if beta is None:
        std = (("std", float(cell["qk_scale"]) / math.sqrt(d)),)
        WQ = _draw(seed, "W_Q", "gaussian", std, n, d, d_qk)
        WK = _draw(seed, "W_K", "gaussian", std, n, d, d_qk)
    else:  # β <x_i, x_j> = (x_i β sqrt(d) I)(x_j I)^T / sqrt(d) (module docstring)
        if d_qk != d:
            raise ConfigError(f"beta={cell['beta']} needs d_qk = d_model = {d}, got {d_qk}")
        WK = torch.eye(d, dtype=torch.float64).expand(n, d, d)
        WQ = WK * (beta * math.sqrt(d))
    return WQ, WK, _values(cell, n, seed), 1 / math.sqrt(d_qk)


def build_weights(cell: dict[str, Any], seed: int) -> list[LayerWeights]:
    """Per-layer float64 weights of ``cell`` under weight seed ``seed`` (:func:`weight_stack`)."""
    WQ, WK, WV, scale = weight_stack(cell, seed)
    layers = [LayerWeights(W_Q=WQ[t], W_K=WK[t], W_V=WV[t].clone(), scale=scale) for t in range(len(WV))]
    return layers * cell["depth"] if cell["shared"] else layers


def value_log_norm(cell: dict[str, Any], seeds: range) -> float:
    """``max`` over the weight seeds and ``t = 0..depth`` of ``sum_{s<t} ln ||W_V(s)||_2`` (>= 0):
    0 iff every partial product of the ``W_V`` has norm <= 1 (assumption A2, docs/theory.md §1)."""
    worst = 0.0
    for s in seeds:
        n = 1 if cell["shared"] else cell["depth"]
        logs = _log_value_norms(cell["value"], float(cell["value_scale"]), cell["d_model"], cell["n_tokens"], n, s)
        if cell["shared"]:
            logs = logs.expand(cell["depth"])
        worst = max(worst, float(torch.cumsum(logs, 0).max()))
    return worst


@lru_cache(maxsize=32)
def _log_value_norms(family: str, value_scale: float, d_model: int, n_tokens: int, n: int, seed: int) -> torch.Tensor:
    cell = {"value": family, "value_scale": value_scale, "d_model": d_model, "n_tokens": n_tokens}
    return torch.log(torch.linalg.matrix_norm(_values(cell, n, seed), ord=2))


def make_input(kind: str, n_samples: int, n_tokens: int, d_model: int, seed: int) -> torch.Tensor:
    """X(0) ``(n_samples, n_tokens, d_model)`` float64 of the registry input ``kind`` under
    seed ``seed`` (``wikipedia``: window block ``seed`` of the windows cut with seed 0)."""
    kind = canonical_input(kind)
    if Spec.name_of(kind) == "wikipedia":
        return make_tokens(kind, n_samples, n_tokens, d_model, seed=0, block=seed)
    return make_tokens(kind, n_samples, n_tokens, d_model, seed=seed)


def _entropy_per_layer(attention: list[torch.Tensor], allowed: torch.Tensor) -> np.ndarray:
    """``(depth, B)`` :func:`~rankcollapse.metrics.attention.row_entropy` of every layer."""
    return row_entropy(torch.stack(attention), allowed).numpy()  # (T, B, H, N, N) -> (T, B)


def run_cell(cell: dict[str, Any], *, n_samples: int = 4, seeds: int = 1, seed: int = 0) -> dict[str, Any]:
    """The row of ``cell`` simulated for ``seeds`` weight draws (``seed``, ``seed+1``, ...) with
    ``n_samples`` inputs each. Refuses (:func:`.grid.check_cells`) a cell the dynamics cannot
    run or above :data:`.grid.DENSE_MAX_TOKENS` tokens (``run_phase`` runs those)."""
    check_cells([cell], n_samples)
    if cell["n_tokens"] > DENSE_MAX_TOKENS:
        raise ConfigError(f"run_cell records every layer's (N, N) attention: N = {cell['n_tokens']} is above "
                          f"{DENSE_MAX_TOKENS}; run the cell with rankcollapse.phase.run_phase (windowed kernel)")

    N, d = cell["n_tokens"], cell["d_model"]
    mask = parse_mask(cell["mask"], N)
    info = analyze(mask)
    cfg = block_config(cell)
    dense = mask.to_dense()
    trajectories, envelopes, finals, deficits, sinks = [], [], [], [], []
    eps_min = 1.0
    for s in range(seed, seed + seeds):
        X0 = make_input(cell["input"], n_samples, N, d, s)
        weights = build_weights(cell, s)
        try:
            run = RunConfig(depth=cell["depth"], dtype=torch.float64, record_states=True, record_attention=True,
                            record_epsilon=True)
            res = simulate(X0, mask, block=cfg, run=run, weights=weights, metrics=("mu_relative", "mu", "avg_cos"))
        except ConfigError as exc:
            if "non-finite" not in str(exc):
                raise
            trajectories += [{"diverged": True}] * n_samples
            if envelope_applies(cell, info):  # not checked: overflowed
                envelopes.append({"violations": np.full(n_samples, -1), "log10_margin": np.full(n_samples, np.nan),
                                  "layers": cell["depth"] + 1})
            continue
        ent = _entropy_per_layer(res.attention, dense)
        eps_min = min(eps_min, float(res.epsilon_measured.min()))
        trajectories += trajectory_measures(res.metrics, res.states, ent)
        eps_b = torch.stack([A.masked_fill(~dense, 1.0).flatten(1).amin(1) for A in res.attention]).amin(0)
        env = _envelope(cell, info, res.metrics["mu"].numpy(), X0, eps_b.numpy(), np.zeros(n_samples, dtype=bool))
        envelopes += [env] if env is not None else []
        deficit = torch.stack([1.0 - A.sum(-1).mean(dim=(-1, -2)) for A in res.attention]).mean(0)  # (samples,)
        finals.append(res.states[-1])
        deficits.append(deficit)
        sinks.append(sink_mass(res.attention[-1][:, 0]))  # one head: (samples, N, N) -> (samples,)
    row = label_cell(trajectories)
    row.update(radius=info.radius, qsc=bool(info.quasi_strongly_connected), epsilon_measured=eps_min)
    row.update(_envelope_columns({"violations": np.concatenate([e["violations"] for e in envelopes]),
                                  "log10_margin": np.concatenate([e["log10_margin"] for e in envelopes]),
                                  "layers": envelopes[0]["layers"]} if envelopes else None, slice(None)))
    if finals:  # the trajectories of seeds that did not overflow
        row.update(operator_columns(torch.cat(finals), torch.cat(deficits), torch.zeros(sum(len(f) for f in finals),
                                    dtype=torch.bool), slice(None)))
    else:
        row.update(row_mass_deficit=float("nan"), norm_spread=float("nan"), max_token_share=float("nan"))
    mass = torch.cat(sinks) if sinks else torch.zeros(0)  # the seeds that did not overflow
    row.update(sink_columns(mass, torch.zeros(len(mass), dtype=torch.bool), slice(None),
                            uniform_sink_mass(dense)))
    row["value_log_norm"] = value_log_norm(cell, range(seed, seed + seeds))
    row.update(theory_prediction(cell, info, eps_min, row["value_log_norm"]))
    return row


def operator_columns(X: torch.Tensor, deficit: torch.Tensor, diverged: torch.Tensor, part: slice) -> dict[str, float]:
    """Per cell, over its trajectories that did not diverge: the mean ``row_mass_deficit`` and
    the medians of ``norm_spread`` (NaN where a token is zero) and ``max_token_share`` at the
    last layer."""
    ok = ~diverged[part]
    if not bool(ok.any()):
        return {"row_mass_deficit": float("nan"), "norm_spread": float("nan"), "max_token_share": float("nan")}
    last = X[part][ok]
    norms = torch.linalg.vector_norm(last, dim=-1)
    low = norms.amin(-1)
    spread = torch.where(low > 0, norms.amax(-1) / low.clamp_min(torch.finfo(norms.dtype).tiny), float("nan"))
    nonzero = norms.amax(-1) > 0
    share = max_token_share(last[nonzero]) if bool(nonzero.any()) else torch.full((1,), float("nan"))
    return {"row_mass_deficit": float(deficit[part][ok].mean()), "norm_spread": float(spread.median()),
            "max_token_share": float(share.median())}


def sink_mass(A: torch.Tensor) -> torch.Tensor:
    """The first token's mass ``(...)`` of one-head attention ``A`` ``(..., N, N)``: the mean over
    queries ``i >= 1`` of ``A[i, 0]`` (:func:`rankcollapse.models.sinks.first_token_mass`); NaN
    when ``N = 1``."""
    N = A.shape[-1]
    if N < 2:
        return torch.full(A.shape[:-2], float("nan"), dtype=torch.float64)
    flat = A.reshape(-1, 1, N, N)
    return first_token_mass(flat, torch.ones(len(flat), N, dtype=torch.bool)).view(A.shape[:-2])


def uniform_sink_mass(allowed: torch.Tensor) -> float:
    """:func:`sink_mass` of uniform attention over each row of the bool mask ``allowed``
    ``(N, N)``, the reference a sink is read against."""
    rows = allowed.sum(-1, keepdim=True).clamp_min(1)
    return float(sink_mass(allowed.to(torch.float64) / rows))


def sink_columns(mass: torch.Tensor, diverged: torch.Tensor, part: slice, uniform: float) -> dict[str, float]:
    """Per cell: ``sink_mass``, the mean of ``mass`` ``(B,)`` over its trajectories that did not
    diverge, and ``sink_mass_uniform``."""
    ok = ~diverged[part]
    value = float(mass[part][ok].mean()) if bool(ok.any()) else float("nan")
    return {"sink_mass": value, "sink_mass_uniform": uniform}
