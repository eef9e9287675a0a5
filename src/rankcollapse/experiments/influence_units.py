"""Influence profiles as table rows (``configs/influence.yaml``; docs/reproduce.md,
"Position-bias claims").

``mask_influence``: :func:`rankcollapse.masks.influence` of a mask under uniform attention
(exact, float64), one row per depth ``h`` (``layer = h``), and with ``profiles: true`` the
profile (metric ``influence`` at ``point = "position.j"``). ``model_influence``:
:func:`rankcollapse.models.influence.measure_influence` of a model on the run's windows
(profiles ``gradient``, ``rollout``, ``predicted``, ``predicted_shuffled``; per layer
``alpha``, ``rho_gradient``, ``rho_rollout``). The rows and labels: docs/reproduce.md.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .._validate import Spec
from ..errors import ConfigError
from ..summary import exact_stats
from .table import normalise
from .units import _labels, _model_unit, register

def _row(layer: int, metric: str, value: float, **extra: Any) -> dict[str, Any]:
    return {"layer": layer, "metric": metric, **exact_stats(value), **extra}


def mask_influence_rows(p: dict[str, Any]) -> pd.DataFrame:
    """Rows of one ``mask_influence`` unit: ``mask``, ``n_tokens``, ``depth``, ``alpha``, optionally ``decay`` (0),
    ``epsilon`` (0.01), ``profiles`` (False); :class:`MaskError` as :func:`~rankcollapse.masks.influence`."""
    from ..masks.influence import influence, window_horizon

    spec, n, depth = str(p["mask"]), int(p["n_tokens"]), int(p["depth"])
    alpha, decay, eps = float(p["alpha"]), float(p.get("decay", 0.0)), float(p.get("epsilon", 0.01))
    res = influence(spec, n, depth=depth, alpha=alpha, decay=decay, epsilon=eps)
    prof = res.profiles
    width = int(Spec.parse(spec, "mask").params["w"]) if Spec.name_of(spec) == "causal_sliding_window" else None
    rows = []
    for h in range(1, depth + 1):
        s = res.per_depth[h - 1]
        rows += [_row(h, "first_token_mass", s["first_token_mass"]), _row(h, "last_token_mass", s["last_token_mass"]),
                 _row(h, "effective_horizon", s["effective_horizon"])]
        if n >= 2 and prof[h - 1, -2] > 0:  # a ratio only where the neighbour has influence
            rows.append(_row(h, "recency_ratio", prof[h - 1, -1] / prof[h - 1, -2]))
        if h >= 2 and prof[h - 2, 0] > 0:  # no step from a first token the last cannot reach yet
            rows.append(_row(h, "first_token_step", prof[h - 1, 0] / prof[h - 2, 0]))
        if width is not None and not decay:
            rows.append(_row(h, "horizon_predicted", window_horizon(width, h, alpha, eps)))
            if 0.0 < alpha < 1.0:
                rows.append(_row(h, "horizon_geometric", width * math.log(eps) / math.log(1.0 - alpha)))
    df = pd.DataFrame(rows)
    if p.get("profiles"):
        df = pd.concat([df, _profile_rows(prof)], ignore_index=True)
    return df


def _profile_rows(prof: np.ndarray, values: np.ndarray | None = None) -> pd.DataFrame:
    """Rows of metric ``influence`` for ``prof (L, N)`` (layers 1..L), with the per-window ``values (W, L, N)``."""
    n_layers, n = prof.shape
    layer = np.repeat(np.arange(1, n_layers + 1), n)
    pos = np.tile(np.arange(n), n_layers)
    mean = prof.reshape(-1).astype(np.float64)
    df = pd.DataFrame({"layer": layer, "metric": "influence", "point": [f"position.{j}" for j in pos], "mean": mean})
    if values is None:
        for k in ("q05", "q25", "q50", "q75", "q95"):
            df[k] = mean
        df["std"], df["n_samples"] = 0.0, 1
        return df
    from ..summary import summarise

    flat = values.reshape(values.shape[0], -1).T  # (L * N, W)
    for k, v in summarise(flat).items():
        if k != "mean":
            df[k] = v
    df["values"] = list(flat)
    return df


def run_mask_influence(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``mask_influence`` unit kind."""
    p = unit.params
    decay = float(p.get("decay", 0.0))
    variant = f"alpha={float(p['alpha']):g},n_tokens={int(p['n_tokens'])}" + (f",decay={decay:g}" if decay else "")
    labels = _labels(unit, model="uniform", variant=variant,
                     depth=int(p["depth"]), mask=Spec.name_of(p["mask"]), mask_spec=str(p["mask"]))
    return normalise(mask_influence_rows(p), labels)


def model_influence_rows(df: pd.DataFrame, shuffle_seed: int = 0) -> pd.DataFrame:
    """Rows of one ``model_influence`` unit from ``measure_influence``'s table ``df``."""
    prof, per = df.attrs["profiles"], df.attrs["per_window"]
    n = prof["predicted"].shape[1]
    perm = np.random.default_rng(shuffle_seed).permutation(n)
    parts = [_profile_rows(per["gradient"].mean(0), per["gradient"]).assign(variant="gradient"),
             _profile_rows(per["rollout"].mean(0), per["rollout"]).assign(variant="rollout"),
             _profile_rows(prof["predicted"]).assign(variant="predicted"),
             _profile_rows(prof["predicted"][:, perm]).assign(variant="predicted_shuffled")]
    scalars = [_row(int(r["layer"]), m, r[m], variant="predicted") for r in df.to_dict("records")
               for m in ("alpha", "rho_gradient", "rho_rollout")]
    return pd.concat(parts + [pd.DataFrame(scalars)], ignore_index=True)


def run_model_influence(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``model_influence`` unit kind: ``model``, ``n_samples`` and optionally
    ``control`` (``random-init``), ``n_probes`` (4), ``batch_size`` (4), ``shuffle_seed`` (0)."""
    from ..models.influence import measure_influence

    p = unit.params
    loaded, win, labels = _model_unit(unit, ctx)
    n_probes = p.get("n_probes", 4)
    if n_probes is not None and int(n_probes) < 1:
        raise ConfigError(f"n_probes must be >= 1 or null, got {n_probes}")
    df = measure_influence(loaded, win, batch_size=int(p.get("batch_size", 4)),
                           n_probes=None if n_probes is None else int(n_probes), seed=int(p.get("probe_seed", 0)))
    labels.pop("variant")
    return normalise(model_influence_rows(df, int(p.get("shuffle_seed", 0))), labels)


register("mask_influence", run_mask_influence, 1)
register("model_influence", run_model_influence, 1)
