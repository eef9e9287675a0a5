"""The ``energy`` unit kind (``configs/energy.yaml``, docs/reproduce.md): a probe of a
model (or its ``control: random-init``) at ``embeddings`` (layer 0) and every
``layer.k.output`` (layer k + 1), per-window values: ``interaction_energy`` ``E_1 =
(1/2) sum_{i,j} exp(<u_i, u_j>)``, ``mu_relative``, and at layer l >= 1 the
``contraction`` ``c_l = (mu/||X||_F)(l) / (mu/||X||_F)(l - 1)`` and ``value_radius``
``rho(sum_h W_V^h W_O^h)`` of block l - 1 (repeated per window). Labels ``variant = full``,
``value = pretrained | random_init``. Constructed controls: :mod:`.energy_controls`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .table import normalise, rows_from_metrics
from .units import _model_unit, _probe_per_window, register

#: Metrics the ``energy`` unit's probe records at every hidden state.
PROBE_METRICS = ("mu_relative", "interaction_energy")


def energy_rows(df: pd.DataFrame, radii: list[float]) -> pd.DataFrame:
    """Rows of one ``energy`` unit from the probe's per-window table ``df`` and the blocks' ``radii``."""
    hidden = df[df["point"].eq("embeddings") | df["point"].str.fullmatch(r"(.*\.)?layer\.\d+\.output")]
    per = {m: hidden[hidden["metric"] == m].sort_values("layer") for m in PROBE_METRICS}
    layers = [int(x) for x in per["mu_relative"]["layer"]]
    points = list(per["mu_relative"]["point"])
    vals = {m: np.stack([np.asarray(v, dtype=np.float64) for v in rows["values"]]) for m, rows in per.items()}
    W = vals["mu_relative"].shape[1]
    derived = {"contraction": vals["mu_relative"][1:] / vals["mu_relative"][:-1],
               "value_radius": np.repeat(np.asarray(radii, dtype=np.float64)[:, None], W, axis=1)}
    return pd.concat([rows_from_metrics(vals, {}, layers=layers, points=points),
                      rows_from_metrics(derived, {}, layers=layers[1:], points=points[1:])], ignore_index=True)


def block_radii(loaded: Any) -> list[float]:
    """``rho(sum_h W_V^h W_O^h)`` of every attention layer of ``loaded``, in order."""
    from ..dynamics.pretrained import extract_attention_weights
    from ..metrics.power import spectral_radius, value_output_map

    return [spectral_radius(value_output_map(lw)) for lw in extract_attention_weights(loaded.model)]


def run_energy(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``energy`` unit kind: ``model``, ``n_samples``, optionally ``control``, ``batch_size`` (8)."""
    loaded, win, labels = _model_unit(unit, ctx)
    df = _probe_per_window(loaded, win, list(PROBE_METRICS), int(unit.params.get("batch_size", 8)))
    return normalise(energy_rows(df, block_radii(loaded)), labels)


register("energy", run_energy, 2)
