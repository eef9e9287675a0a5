"""`rankcollapse metrics FILE.npy`: every collapse/anisotropy metric of a saved array."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import masks, metrics
from .._io import load_array, load_npy
from .._memory import parse_size
from ..errors import DataError, MetricError
from ._boundary import n_tokens_from
from ._output import FORMAT_HELP, check_format, make_table, print_result, print_table

_DTYPES = ("float64", "float32")  # names of torch dtypes: torch is imported only when a command runs


def _print_table(report, shape: tuple) -> None:
    batched = report.batched
    cols = ("mean", "std", "min", "max") if batched else ("value",)
    rows = []
    for name, v in report.values.items():
        if name in report.undefined:
            rows.append([name, *(["undefined"] * len(cols))])
            continue
        v = v.double()
        stats = (v.mean(), v.std(correction=0), v.min(), v.max()) if batched else (v,)
        rows.append([name, *(f"{float(s):.6g}" for s in stats)])
    table = make_table(f"metrics of X {shape}" + (" (over samples)" if batched else ""), ("metric", *cols), rows)
    for col in table.columns[1:]:
        col.justify = "right"
    print_table(table)
    for name, reason in report.undefined.items():
        typer.echo(f"{name}: undefined: {reason}")


def metrics_command(
    file: Optional[Path] = typer.Argument(None, metavar="FILE",
                                          help="A .npy array (or .pt tensor) of tokens, shape (N, d) or (B, N, d)."),
    fmt: str = typer.Option("table", "--format", help=FORMAT_HELP),
    names: Optional[str] = typer.Option(None, "--metrics", help="Comma-separated metric names (default: all)."),
    padding_mask: Optional[Path] = typer.Option(
        None, "--padding-mask", help="A .npy bool/0-1 array (N,) or (B, N); True = real token."),
    mask: Optional[str] = typer.Option(
        None, "--mask", help="Mask spec for the graph metrics, e.g. causal (default: complete)."),
    dtype: str = typer.Option("float64", "--dtype", help="Compute dtype: float64 or float32."),
    max_memory: Optional[str] = typer.Option(
        None, "--max-memory", help="Memory the (N, N) pairwise metrics may use, e.g. 32GiB (default half the RAM)."),
    states: Optional[Path] = typer.Option(
        None, "--states", help="Instead of FILE: a folder of hidden states (probe --save-states, or a transformers "
        "output_hidden_states dump); prints the per-layer table of probe (default metrics: probe's)."),
) -> None:
    """Compute collapse and anisotropy metrics of a saved token array (or, with --states, the per-layer
    table of saved hidden states)."""
    check_format(fmt)
    if states is not None:  # the probe's table of recorded hidden states, printed as `probe` prints it
        if file is not None:
            raise MetricError(f"give FILE or --states, not both (got {str(file)!r} and --states {str(states)!r})")
        from .probe import probe_recorded

        probe_recorded(states, names, fmt, allowed=("states", "names", "fmt"), why="--states measures each point as "
                       "probe does (real tokens, float64, the model's own mask)")
        return
    if file is None:
        raise MetricError("give FILE (a .npy or .pt token array) or --states DIR (recorded hidden states)")
    if dtype not in _DTYPES:
        raise MetricError(f"--dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    X = load_array(file, "token array", error=DataError)
    if X.ndim not in (2, 3):
        raise MetricError(f"{file}: expected shape (N, d) or (B, N, d), got {X.shape}")
    pm = load_npy(padding_mask, "padding mask", error=DataError) if padding_mask is not None else None
    chosen = tuple(metrics.METRICS) if names is None else tuple(n.strip() for n in names.split(",") if n.strip())
    expanded = tuple(metrics.METRICS) if chosen == ("all",) else chosen
    if mask is not None and all(n in metrics.METRICS for n in expanded) \
            and not any(metrics.METRICS[n].uses_mask for n in expanded):
        graph_metrics = ", ".join(n for n, spec in metrics.METRICS.items() if spec.uses_mask)
        raise MetricError(f"--mask applies to the metrics on the mask's graph ({graph_metrics}); "
                          f"none of --metrics {','.join(expanded)} uses it")
    import torch

    with n_tokens_from(f"the N of FILE {str(file)!r}"):
        graph = None if mask is None else masks.parse_mask(mask, X.shape[-2])
    report = metrics.report_metrics(X, chosen, padding_mask=pm, mask=graph, dtype=getattr(torch, dtype),
                                    max_memory=parse_size(max_memory))
    doc = report.rows()  # undefined metrics are null with their reason: always strict JSON
    if not print_result(fmt, doc, doc if isinstance(doc, list) else [doc], indent=2):
        _print_table(report, tuple(X.shape))
