"""`probe --influence`: option checks and output of the influence comparison
(:func:`rankcollapse.models.influence.measure_influence`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .._io import atomic_path, write_json_atomic
from ..errors import ConfigError
from ._output import print_result, print_table, records_table


def check_influence_options(**given: Any) -> None:
    """Refuse the probe options ``--influence`` does not use (it measures the model as it
    is, on its own mask or ``--mask``)."""
    defaults = {"points": "hidden_states", "drop": "", "attentions": False, "clip_massive": False}
    for name, value in given.items():
        if value is not None and value != defaults.get(name, None):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"--influence measures the model as it is, on its own mask or --mask; {flag} does "
                              "not apply")


def _records(tables: list) -> list[dict]:
    return [{"model": t.attrs["model"], **row} for t in tables for row in t.to_dict(orient="records")]


def report_influence(tables: list, out: Optional[Path], fmt: str, *, allow_nonempty: bool = False) -> None:
    """Print the per-layer table (a ``model`` column first) and, with ``out``, write
    ``influence.csv`` and ``influence.json`` (the table plus each model's profiles)."""
    rows = _records(tables)
    doc = {"models": [{"model": t.attrs["model"], "family": t.attrs["family"], "mask": t.attrs["mask"],
                       "n_tokens": t.attrs["length"], "n_probes": t.attrs["n_probes"],
                       "layers": t.to_dict(orient="records"),
                       "profiles": {k: v.tolist() for k, v in t.attrs["profiles"].items()}} for t in tables]}
    if out is not None:
        import pandas as pd

        from .._outdir import writing

        with writing(out, "probe --influence\n", ("influence.csv", "influence.json"),
                     allow_nonempty=allow_nonempty) as stage:
            with atomic_path(stage / "influence.csv") as tmp:
                pd.DataFrame(rows).to_csv(tmp, index=False)
            write_json_atomic(stage / "influence.json", doc)
    if not print_result(fmt, doc, rows):
        print_table(records_table("Spearman's rho between the mask-only influence prediction (uniform attention, "
                                  "fitted alpha) and the measured influence on the last token", rows))
