"""The result of a run: the tidy table, the claims, and where they were written."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .._display import NotebookResult
from ..errors import ConfigError


@dataclass(repr=False)
class RunResult(NotebookResult):
    """What :func:`run_experiment` produced: the tidy ``table`` (:mod:`.table`), the
    claims.json records and the run folder ``out``."""

    out: Path
    table: pd.DataFrame
    claims: list[dict[str, Any]]
    config: dict[str, Any]
    timings: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_pandas(self, what: str = "table") -> pd.DataFrame:
        """``"table"`` (default): a copy of the tidy table; ``"claims"``: one row per claim.

        Raises
        ------
        ConfigError
            ``what`` is neither ``"table"`` nor ``"claims"``.
        """
        if what == "table":
            return self.table.copy()
        if what != "claims":
            raise ConfigError(f"to_pandas(what=...) takes 'table' or 'claims', got {what!r}")
        cols = ("id", "experiment", "verdict", "measured", "interval_low", "interval_high", "n_samples", "n_seeds",
                "decisive")
        rows = []
        for c in self.claims:
            low, high = c.get("interval") or (None, None)
            rows.append({**{k: c.get(k) for k in cols}, "interval_low": low, "interval_high": high})
        return pd.DataFrame(rows, columns=list(cols))

    def to_dict(self) -> dict[str, Any]:
        """Summary for a notebook: run folder, table size, verdict counts, wall seconds."""
        verdicts = Counter(c.get("verdict", "") for c in self.claims)
        return {"out": str(self.out), "rows": int(len(self.table)), "claims": len(self.claims),
                **{f"verdict: {v}": n for v, n in verdicts.items()}, "seconds": float(self.seconds)}

    def __repr__(self) -> str:
        return (f"RunResult(out={str(self.out)!r}, rows={len(self.table)}, claims={len(self.claims)}, "
                f"seconds={self.seconds:.1f})")
