"""Interaction energy and contraction per layer as table rows: the ``energy`` unit kind of
the energy experiment (``configs/energy.yaml``, docs/reproduce.md), and its constructed
float64 controls (theory checks ``energy_*``).

``energy``: a probe of a pretrained model (or its random-init control, ``control:
random-init``) on the run's windows, at the hidden states ``embeddings`` (layer 0) and
``layer.k.output`` (layer k + 1), every row with its per-window values:

* ``interaction_energy``: ``E_1 = (1/2) sum_{i,j} exp(<u_i, u_j>)`` of the unit tokens
  (:func:`rankcollapse.metrics.interaction_energy`, beta = 1), and ``mu_relative``;
* ``contraction`` at layer l >= 1: ``c_l = (mu/||X||_F)(l) / (mu/||X||_F)(l - 1)`` of each
  window, the factor by which block l - 1 (0-based) scales the distance to token
  uniformity relative to the norm (below 1: the block contracts);
* ``value_radius`` at layer l >= 1: the spectral radius ``rho(M)`` of block l - 1's
  combined value-output map ``M = sum_h W_V^h W_O^h``
  (:func:`rankcollapse.models.sinks.value_output_map`), a constant of the weights repeated
  for every window so that a claim's Spearman pairs it with ``contraction``.

Labels: ``source = energy``, ``variant = full``, ``value = pretrained`` or ``random_init``.

Controls (``theory`` unit kind, ``check: energy_<name>``; float64, no windows, rows at
layers 0..L), each fixed by construction and read by the claims through the same
table and statistics:

* ``energy_turning`` / ``energy_rising``: N = 128 unit tokens in a plane at angles spread
  evenly over ``[-t_l, t_l]``; every pair's cosine grows as ``t`` shrinks. ``rising``:
  ``t = 1, 1/2, 1/4, 1/8, 1/16, 1/32`` (E grows at every layer: monotone);
  ``turning``: ``t = 1/8, 1/4, 1/2, 1, 1/2, 1/4`` (E falls three layers, then grows).
* ``energy_aligned`` / ``energy_spread``: X0 ``(128, 8)`` with mean ``a e_1`` (a = 0.5)
  and centred Gaussian rows in ``e_2..e_8`` (seed 0); layer l applies
  ``W_l = diag(r_l, 1, ..., 1)`` (``aligned``) or ``diag(1, r_l, 1, ..., 1)``
  (``spread``) to X0, with ``r_l`` = :data:`CONTROL_RADII`, and records ``c_l =
  (mu/||X||_F)(X0 W_l) / (mu/||X||_F)(X0)`` beside ``rho(W_l) = r_l``. ``aligned``: only
  the mean grows, ``c_l = sqrt((N a^2 + ||R||^2) / (N r_l^2 a^2 + ||R||^2))`` falls
  strictly with ``r_l`` (Spearman -1); ``spread``: only the spread along ``e_2`` grows,
  ``c_l`` rises strictly with ``r_l`` (Spearman +1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from ..sweep.units import register_unit_kind
from .table import normalise, rows_from_metrics
from .units import _labels, _probe_condition, _probe_per_window, key_params

#: Metrics the ``energy`` unit's probe records at every hidden state.
PROBE_METRICS = ("mu_relative", "interaction_energy")
#: ``rho(W_l)`` of the contraction controls' layers 1..6 (ranked 3, 6, 2, 5, 1, 4).
CONTROL_RADII = (1.5, 3.0, 1.2, 2.5, 1.1, 2.0)
#: Half-spreads ``t_l`` (radians) of the energy controls' fans at layers 0..5.
RISING_SPREADS = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125)
TURNING_SPREADS = (0.125, 0.25, 0.5, 1.0, 0.5, 0.25)


def _steps(values: np.ndarray) -> np.ndarray:
    """``values[l] / values[l - 1]`` for l = 1..L of ``values (L + 1, W)``."""
    return values[1:] / values[:-1]


def energy_rows(df: pd.DataFrame, radii: list[float]) -> pd.DataFrame:
    """Rows of one ``energy`` unit (module docstring) from the probe's per-window table
    ``df`` (hidden-state points only) and the blocks' ``radii`` ``rho(M_k)``, k = 0..L-1."""
    hidden = df[df["point"].eq("embeddings") | df["point"].str.fullmatch(r"(.*\.)?layer\.\d+\.output")]
    per = {m: hidden[hidden["metric"] == m].sort_values("layer") for m in PROBE_METRICS}
    layers = [int(x) for x in per["mu_relative"]["layer"]]
    points = list(per["mu_relative"]["point"])
    vals = {m: np.stack([np.asarray(v, dtype=np.float64) for v in rows["values"]]) for m, rows in per.items()}
    W = vals["mu_relative"].shape[1]
    derived = {"contraction": _steps(vals["mu_relative"]),
               "value_radius": np.repeat(np.asarray(radii, dtype=np.float64)[:, None], W, axis=1)}
    return pd.concat([rows_from_metrics(vals, {}, layers=layers, points=points),
                      rows_from_metrics(derived, {}, layers=layers[1:], points=points[1:])], ignore_index=True)


def block_radii(loaded: Any) -> list[float]:
    """``rho(sum_h W_V^h W_O^h)`` of every block of ``loaded`` (one stack), in order."""
    from ..models.edits import n_heads
    from ..models.families import stacks
    from ..models.sinks import spectral_radius, value_output_map

    model = loaded.model
    heads = n_heads(model)
    return [spectral_radius(value_output_map(parts, model.config, heads))
            for stack in stacks(model, loaded.family) for parts in stack.blocks]


def run_energy(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``energy`` unit kind (module docstring): ``model``, ``n_samples`` and optionally
    ``control`` (``random-init``, seed ``control_seed``) and ``batch_size`` (8)."""
    from ..models.families import family
    from ..models.probe import probe

    p = unit.params
    loaded = ctx.model(p["model"])
    win = ctx.windows(p["model"], int(p["n_samples"]))
    variant, value, loaded = _probe_condition(p, loaded, ())
    df = _probe_per_window(probe, loaded, win, (), list(PROBE_METRICS), int(p.get("batch_size", 8)))
    native = family(loaded.family).native_mask
    labels = _labels(unit, mask=native, mask_spec=native, variant=variant, value=value, family=loaded.family)
    return normalise(energy_rows(df, block_radii(loaded)), labels)


# ------------------------------------------------------------------ constructed controls
def _fan_rows(spreads: tuple[float, ...], n: int = 128) -> pd.DataFrame:
    from ..metrics import interaction_energy

    E = np.array([[float(interaction_energy(np.stack([np.cos(a), np.sin(a)], axis=1)))]
                  for a in (np.linspace(-t, t, n) for t in spreads)])  # (L + 1, 1)
    return rows_from_metrics({"interaction_energy": E}, {})


def rows_energy_rising(params: dict[str, Any], ctx: Any = None) -> pd.DataFrame:
    """Energy control: a fan of unit tokens closing at every layer (E monotone, rising)."""
    return _fan_rows(RISING_SPREADS)


def rows_energy_turning(params: dict[str, Any], ctx: Any = None) -> pd.DataFrame:
    """Energy control: a fan that opens for three layers, then closes (E falls, then rises)."""
    return _fan_rows(TURNING_SPREADS)


def _value_rows(axis: int) -> pd.DataFrame:
    from ..metrics import mu_relative
    from ..models.sinks import spectral_radius

    n, d, a = 128, 8, 0.5
    R = np.random.default_rng(0).standard_normal((n, d))
    R[:, 0] = 0.0
    R -= R.mean(axis=0)
    X0 = torch.from_numpy(R + a * np.eye(d)[0])
    m0 = float(mu_relative(X0))
    c, rho = [], []
    for r in CONTROL_RADII:
        Wl = torch.eye(d, dtype=torch.float64)
        Wl[axis, axis] = r
        c.append(float(mu_relative(X0 @ Wl)) / m0)
        rho.append(spectral_radius(Wl))
    layers = list(range(1, len(CONTROL_RADII) + 1))
    return rows_from_metrics({"contraction": np.array(c)[:, None], "value_radius": np.array(rho)[:, None]}, {},
                             layers=layers)


def rows_energy_aligned(params: dict[str, Any], ctx: Any = None) -> pd.DataFrame:
    """Contraction control: W_l grows the mean direction only (c_l falls with rho(W_l))."""
    return _value_rows(0)


def rows_energy_spread(params: dict[str, Any], ctx: Any = None) -> pd.DataFrame:
    """Contraction control: W_l grows a spread direction only (c_l rises with rho(W_l))."""
    return _value_rows(1)


# Registered with the sweep engine beside the other experiment kinds (schema.py imports
# this module); the version is bumped when a change alters these units' labels or numbers.
register_unit_kind("energy", run_energy, version=1, group="experiments", key_params=key_params)
