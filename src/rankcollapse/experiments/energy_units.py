"""Interaction energy and contraction per layer as table rows: the ``energy`` unit kind of
the energy experiment (``configs/energy.yaml``, docs/reproduce.md).

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
  (:func:`rankcollapse.metrics.power.value_output_map`), a constant of the weights repeated
  for every window so that a claim's Spearman pairs it with ``contraction``.

Labels: ``source = energy``, ``variant = full``, ``value = pretrained`` or ``random_init``.

Its constructed float64 controls are :mod:`.energy_controls`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..sweep.units import register_unit_kind
from .table import normalise, rows_from_metrics
from .units import _labels, _probe_condition, _probe_per_window, key_params

#: Metrics the ``energy`` unit's probe records at every hidden state.
PROBE_METRICS = ("mu_relative", "interaction_energy")


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
    """``rho(sum_h W_V^h W_O^h)`` of every attention layer of ``loaded``, in order
    (:func:`rankcollapse.dynamics.pretrained.extract_attention_weights`)."""
    from ..dynamics.pretrained import extract_attention_weights
    from ..metrics.power import spectral_radius, value_output_map

    return [spectral_radius(value_output_map(lw)) for lw in extract_attention_weights(loaded.model)]


def run_energy(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``energy`` unit kind (module docstring): ``model``, ``n_samples`` and optionally
    ``control`` (``random-init``, seed ``control_seed``) and ``batch_size`` (8)."""
    from ..models.families import native_mask_of
    from ..models.probe import probe

    p = unit.params
    loaded = ctx.model(p["model"])
    win = ctx.windows(p["model"], int(p["n_samples"]))
    variant, value, loaded = _probe_condition(p, loaded, ())
    df = _probe_per_window(probe, loaded, win, (), list(PROBE_METRICS), int(p.get("batch_size", 8)))
    native = native_mask_of(loaded)
    labels = _labels(unit, mask=native, mask_spec=native, variant=variant, value=value, family=loaded.family)
    return normalise(energy_rows(df, block_radii(loaded)), labels)


# Registered with the sweep engine beside the other experiment kinds (schema.py imports
# this module); the version is bumped when a change alters these units' labels or numbers.
# version 2: value radii from the weights themselves, not from a float32 forward of the
# identity (which added and removed the bias in float32: 1.5e-8 relative on MiniLM)
register_unit_kind("energy", run_energy, version=2, group="experiments", key_params=key_params)
