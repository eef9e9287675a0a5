"""A metrics report where one undefined metric never hides the others: a metric undefined
on the input, not finite at its scale or over the memory limit is reported as ``None`` with
a reason; only an input no metric can take raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch

from .._display import NotebookResult
from ..errors import MemoryLimitError, MetricError
from .registry import DEFAULT_METRICS, METRICS, _as_dtype, check_pairwise_memory, compute_metrics

@dataclass
class MetricReport(NotebookResult):
    """Values of the metrics that are defined, and why the others are not.

    Attributes
    ----------
    values : ``name -> tensor`` (0-d or ``(B,)``), every requested metric in order; NaN where
        undefined.
    undefined : ``name -> reason``; a metric undefined on some samples is undefined for all.
    batched : True for a ``(B, N, d)`` input.
    """

    values: dict[str, torch.Tensor]
    undefined: dict[str, str] = field(default_factory=dict)
    batched: bool = False

    def rows(self) -> dict | list[dict]:
        """JSON-ready rows (undefined values ``None``, with ``"undefined": {name: reason}``):
        one dict for ``(N, d)``, one per sample for a batch."""
        table = {name: v.double().reshape(-1).tolist() for name, v in self.values.items()}
        n_rows = len(next(iter(table.values())))
        out = []
        for i in range(n_rows):
            row = {name: (col[i] if math.isfinite(col[i]) else None) for name, col in table.items()}
            missing = {name: self.undefined[name] for name, v in row.items() if v is None and name in self.undefined}
            if missing:
                row["undefined"] = missing
            out.append(row)
        return out if self.batched else out[0]

    def to_pandas(self) -> Any:
        """Tidy :class:`pandas.DataFrame` ``sample, metric, value, undefined`` (float64; NaN
        and the reason where undefined, else ``""``), one row per sample and metric."""
        import pandas as pd

        names = list(self.values)
        cols = [self.values[n].detach().double().cpu().reshape(-1).numpy() for n in names]
        B = len(cols[0]) if cols else 0
        return pd.DataFrame({
            "sample": np.tile(np.arange(B), len(names)),
            "metric": np.repeat(np.array(names, dtype=object), B),
            "value": np.concatenate(cols) if cols else np.zeros(0),
            "undefined": np.repeat(np.array([self.undefined.get(n, "") for n in names], dtype=object), B),
        })

    def to_dict(self) -> dict[str, Any]:
        """Summary for a notebook: metrics, sample count, and the undefined ones."""
        n = len(next(iter(self.values.values())).reshape(-1)) if self.values else 0
        return {"metrics": list(self.values), "batched": self.batched, "n_samples": n,
                "undefined": list(self.undefined)}


def report_metrics(
    X, names: Iterable[str] | None = None, *, padding_mask=None, mask=None, dtype=None,
    rank_atol: float | None = None, rank_rtol: float | None = None, max_memory: int | str | None = None,
) -> MetricReport:
    """Metrics of ``X`` with undefined ones reported, not raised (module docstring).

    Parameters as :func:`~rankcollapse.metrics.compute_metrics`; a metric above ``max_memory``
    is undefined with the estimate in the reason. :class:`MetricError` for unknown names, or
    an input no requested metric can take (the first error).
    """
    names = DEFAULT_METRICS if names is None else ((names,) if isinstance(names, str) else tuple(names))
    names = tuple(METRICS) if names == ("all",) else tuple(dict.fromkeys(names))
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        compute_metrics(X, names)  # raises the registry's message
    kw = dict(padding_mask=padding_mask, mask=mask, dtype=dtype, rank_atol=rank_atol, rank_rtol=rank_rtol,
              max_memory=max_memory)
    undefined = {}
    for name in names:  # which metrics are too large on their own; the others still run
        try:
            check_pairwise_memory(X, (name,), _as_dtype(dtype), max_memory)
        except MemoryLimitError as exc:
            undefined[name] = f"the memory limit {exc.detail}"  # read by API and CLI users alike
    todo = [n for n in names if n not in undefined]
    values = _compute(X, todo, undefined, kw) if todo else {}
    if not values:
        raise MetricError("; ".join(f"{n}: {r}" for n, r in undefined.items()))
    template = next(iter(values.values()))
    for name, v in values.items():
        if name not in undefined and not bool(torch.isfinite(v).all()):
            undefined[name] = (f"not finite in {v.dtype} at this input's scale (the formula's squares or sums "
                               "leave the floating-point range)")
    values = {n: values.get(n, torch.full_like(template, math.nan)) for n in names}
    return MetricReport(values, {n: undefined[n] for n in names if n in undefined}, batched=template.ndim == 1)


def _compute(X, todo, undefined, kw) -> dict[str, torch.Tensor]:
    try:
        return compute_metrics(X, todo, **kw)
    except MetricError:
        pass  # find which metrics fail; the others are still reported
    values, first = {}, None
    for name in todo:
        try:
            values[name] = compute_metrics(X, [name], **kw)[name]
        except MetricError as exc:
            undefined[name] = str(exc)
            first = first or exc
    if not values and first is not None:
        raise first
    return values
