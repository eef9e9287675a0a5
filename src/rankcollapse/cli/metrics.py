"""`rankcollapse metrics FILE.npy`: every collapse/anisotropy metric of a saved array."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import typer

from .. import masks, metrics
from .._io import load_npy
from ..errors import DataError, MetricError

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _load_array(path: Path, what: str) -> np.ndarray:
    return load_npy(path, what, error=DataError)


def _graph_mask(spec: str | None, n_tokens: int):
    if spec is None:
        return None
    return masks.parse_mask(spec, n_tokens)


def _rows(values: dict[str, torch.Tensor], batched: bool) -> dict | list[dict]:
    if not batched:
        return {name: float(v) for name, v in values.items()}
    table = torch.stack([v.double() for v in values.values()], dim=1).tolist()
    return [dict(zip(values, row)) for row in table]


def _print_table(values: dict[str, torch.Tensor], batched: bool, shape: tuple) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"metrics of X {shape}" + (" (over samples)" if batched else ""))
    table.add_column("metric")
    cols = ("mean", "std", "min", "max") if batched else ("value",)
    for col in cols:
        table.add_column(col, justify="right")
    for name, v in values.items():
        v = v.double()
        stats = (v.mean(), v.std(correction=0), v.min(), v.max()) if batched else (v,)
        table.add_row(name, *(f"{float(s):.6g}" for s in stats))
    Console().print(table)


def metrics_command(
    file: Path = typer.Argument(..., help="A .npy array of tokens, shape (N, d) or (B, N, d)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document to stdout."),
    names: Optional[str] = typer.Option(None, "--names", help="Comma-separated metric names (default: all)."),
    padding_mask: Optional[Path] = typer.Option(
        None, "--padding-mask", help="A .npy bool/0-1 array (N,) or (B, N); True = real token."
    ),
    mask: Optional[str] = typer.Option(
        None, "--mask", help="Mask spec for the graph metrics, e.g. causal (default: complete)."
    ),
    dtype: str = typer.Option("float64", "--dtype", help="Compute dtype: float64 or float32."),
) -> None:
    """Compute collapse and anisotropy metrics of a saved token array."""
    if dtype not in _DTYPES:
        raise MetricError(f"--dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    X = _load_array(file, "token array")
    if X.ndim not in (2, 3):
        raise MetricError(f"{file}: expected shape (N, d) or (B, N, d), got {X.shape}")
    pm = _load_array(padding_mask, "padding mask") if padding_mask is not None else None
    chosen = tuple(metrics.METRICS) if names is None else tuple(n.strip() for n in names.split(",") if n.strip())
    values = metrics.compute_metrics(
        X, chosen, padding_mask=pm, mask=_graph_mask(mask, X.shape[-2]), dtype=_DTYPES[dtype]
    )
    batched = X.ndim == 3
    if as_json:
        rows = _rows(values, batched)
        flat = rows if isinstance(rows, list) else [rows]
        if any(not math.isfinite(x) for r in flat for x in r.values()):
            raise MetricError("a metric came out non-finite; refusing to print it")
        typer.echo(json.dumps(rows, indent=2))
    else:
        _print_table(values, batched, tuple(X.shape))


def register(app: typer.Typer) -> None:
    """Attach ``rankcollapse metrics`` to the main app."""
    app.command("metrics")(metrics_command)
