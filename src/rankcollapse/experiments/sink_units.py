"""The ``phase_sink`` unit kind (``configs/sinks.yaml``; docs/phase.md, "Head-wise RMSNorm
and the sink"): one phase cell (axes :data:`CELL_AXES`, the rest at their defaults) under
weight seed ``seed_offset + seed``, run by :func:`rankcollapse.phase.batched.run_group`
(float64). Rows at ``layer = depth``: ``sink_mass``, ``sink_mass_uniform`` and
``sink_ratio`` (their ratio, 1 for uniform attention). Labels ``model = gaussian``,
``variant = {placement},shared={off|on},headwise_rmsnorm={off|on}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..sweep.units import Unit
from .table import rows_from_metrics
from .units import _labels, register

#: The phase axes a ``phase_sink`` unit's parameters may set (every other at its default).
CELL_AXES = ("norm", "placement", "shared", "depth", "headwise_rmsnorm", "mask", "n_tokens", "d_model")


def run_phase_sink(unit: Unit, ctx: Any) -> pd.DataFrame:
    """The ``phase_sink`` unit kind."""
    from ..phase.batched import run_group
    from ..phase.grid import expand_grid

    p = unit.params
    (cell,) = expand_grid({k: [p[k]] for k in CELL_AXES if k in p})
    weight_seed = int(p.get("seed_offset", 0)) + int(p["seed"])
    (row,) = run_group([cell], n_samples=int(p["n_samples"]), seeds=1, seed=weight_seed)
    mass, uniform = float(row["sink_mass"]), float(row["sink_mass_uniform"])
    depth = int(cell["depth"])
    shared, headwise = ("on" if bool(cell[k]) else "off" for k in ("shared", "headwise_rmsnorm"))
    variant = f"{cell['placement']},shared={shared},headwise_rmsnorm={headwise}"
    labels = _labels(unit, model="gaussian", mask=str(cell["mask"]), mask_spec=str(cell["mask"]), variant=variant,
                     value=str(cell["value"]), norm=str(cell["norm"]), depth=depth, seed=weight_seed, dtype="float64")
    values = {"sink_mass": np.array([[mass]]), "sink_mass_uniform": np.array([[uniform]]),
              "sink_ratio": np.array([[mass / uniform]])}
    return rows_from_metrics(values, labels, layers=[depth], points=[f"layer.{depth - 1}.output"])


register("phase_sink", run_phase_sink, 1)
