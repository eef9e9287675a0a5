"""Constructed float64 controls of the energy claims (``theory`` checks ``energy_<name>``,
docs/reproduce.md), measured with the ``energy`` unit's metric functions.

* ``energy_rising`` / ``energy_turning``: N = 128 unit tokens in a plane at angles spread
  evenly over ``[-t_l, t_l]`` (:data:`RISING_SPREADS`: E rises at every layer;
  :data:`TURNING_SPREADS`: E falls three layers, then rises).
* ``energy_aligned`` / ``energy_spread``: X0 ``(128, 8)`` with mean ``0.5 e_1`` and centred
  Gaussian rows in ``e_2..e_8`` (seed 0); layer l records ``c_l = (mu/||X||_F)(X0 W_l) /
  (mu/||X||_F)(X0)`` beside ``rho(W_l) = r_l`` (:data:`CONTROL_RADII`), ``W_l`` scaling
  ``e_1`` (``aligned``: c_l falls with r_l, Spearman -1) or ``e_2`` (``spread``: +1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from .table import rows_from_metrics

#: ``rho(W_l)`` of the contraction controls' layers 1..6 (ranked 3, 6, 2, 5, 1, 4).
CONTROL_RADII = (1.5, 3.0, 1.2, 2.5, 1.1, 2.0)
#: Half-spreads ``t_l`` (radians) of the energy controls' fans at layers 0..5.
RISING_SPREADS = (1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125)
TURNING_SPREADS = (0.125, 0.25, 0.5, 1.0, 0.5, 0.25)


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
    from ..metrics.power import spectral_radius

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
