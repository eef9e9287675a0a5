"""`rankcollapse phase`: sweep a grid of dynamics settings and label each cell's regime."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .._outdir import OutputFolder, staged
from ..errors import ConfigError
from ._output import ALLOW_NONEMPTY, check_format, print_result

JSON_COLUMNS = ("mu_relative", "numerical_rank", "stable_rank", "attention_entropy", "rate", "rate_lo", "rate_hi",
                "rate_last", "rate_last_lo", "rate_last_hi", "rate_last_bound_max",
                "frac_rate_last_falling", "regime", "k", "theory_regime", "theory_source",
                "envelope_violations", "frac_mu_floor", "frac_rank_collapse", "frac_collapsing_slowly", "frac_uniform_attention",
                "frac_one_hot_attention", "frac_aligned_without_consensus", "frac_stable_rank_k", "row_mass_deficit", "norm_spread", "max_token_share", "frac_diverging", "frac_undecided",
                "law", "law_exponent", "law_rate", "law_r2_exp", "law_r2_power")


#: ``--n-tokens`` when neither the flag nor a .npy mask file gives N.
N_TOKENS = 32
#: The files a phase run writes whatever its grid (the heatmaps' names follow the grid).
NAMES = ("phase.parquet", "report.html")


def phase(
    axis: list[str] = typer.Option([], "--axis", help="NAME=v1,v2,... (repeatable); names: qk_scale (scale s of "
                                   "Gaussian W_Q, W_K), beta (scores β<x_i,x_j>: a number or a temperature law "
                                   "log:γ, pow:c, ssmax:s, llama4; not with qk_scale), value, value_scale, norm, "
                                   "placement, alpha, qk_norm, headwise_rmsnorm, attention, mask, d_qk, n_tokens, "
                                   "d_model, depth, shared, input"),
    depth: int = typer.Option(64, "--depth", help="layers (an axis 'depth' overrides)"),
    n_tokens: Optional[int] = typer.Option(None, "--n-tokens", help="tokens N (default 32; .npy mask files of the "
                                           "mask axis: their N)"),
    d_model: int = typer.Option(16, "--d-model", help="width d"),
    samples: int = typer.Option(4, "--n-samples", help="inputs per weight seed"),
    seeds: int = typer.Option(1, "--seeds", help="weight draws per cell (seed, seed+1, ...)"),
    seed: int = typer.Option(0, "--seed", help="first weight and input seed"),
    out: Path = typer.Option(..., "--out", help="output folder (phase.parquet, heatmaps, report.html)"),
    zip_axes: Optional[str] = typer.Option(None, "--zip", help="A,B,...: axes varied together (value i of each "
                                           "with value i of the others) instead of crossed: a stratified subset"),
    plot: Optional[str] = typer.Option(None, "--plot", help="X,Y: the two axes of each heatmap panel"),
    executor: str = typer.Option("serial", "--executor", help="serial, processes or ray"),
    workers: Optional[int] = typer.Option(None, "--workers", help="worker processes / Ray CPUs"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="per-cell cache (default OUT/cache)"),
    progress: bool = typer.Option(False, "--progress", help="per-cell progress on stderr"),
    fmt: str = typer.Option("table", "--format", help="stdout: table (a summary line), json ({'cells': [...]}), "
                            "csv or markdown (one row per cell)"),
    allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    """Run every cell of the grid, label its regime (docs/phase.md) and write the report."""
    check_format(fmt)
    from ..sweep.executors import ExecutionConfig
    from ..phase.grid import check_cells, expand_grid, parse_axes, parse_axis
    from ..phase.report import operator_notes, write_report
    from ..phase.sweep import run_phase

    # checked here: a fully cached grid would otherwise accept an executor option it ignores
    execution = ExecutionConfig(executor=executor, workers=workers, progress=progress)
    for name, value, low in (("--n-samples", samples, 1), ("--seeds", seeds, 1), ("--seed", seed, 0)):
        if value < low:
            raise ConfigError(f"{name} must be >= {low}, got {value}")
    axes = parse_axes(axis)
    if n_tokens is None:  # .npy mask files fix N (one N for all of them, else the mask's own error)
        from ..masks.spec import spec_n_tokens

        fixed_n = {spec_n_tokens(m) for m in axes.get("mask", ())} - {None}
        n_tokens = fixed_n.pop() if len(fixed_n) == 1 else N_TOKENS
    fixed = {name: parse_axis(f"{name}={value}")[1][0]
             for name, value in (("depth", depth), ("n_tokens", n_tokens), ("d_model", d_model))}
    plot_axes = None if plot is None else tuple(p.strip() for p in plot.split(","))
    if plot_axes is not None and (len(plot_axes) != 2 or any(p not in axes for p in plot_axes)):
        raise ConfigError(f"--plot expects two of the given axes X,Y, got {plot!r}")
    zipped = tuple(p.strip() for p in zip_axes.split(",")) if zip_axes else ()
    cells = expand_grid(axes, fixed, zipped)
    check_cells(cells, samples, seeds=seeds)  # every cell's size, before the output folder is touched
    names = list(axes) or ["depth"]
    meta = {"fixed": {k: v for k, v in fixed.items() if k not in axes}, "samples": samples, "seeds": seeds, "seed": seed}
    # published whole: a smaller grid after a bigger one leaves none of its heatmaps behind
    with OutputFolder(out, NAMES, allow_nonempty=allow_nonempty, flags=True):
        table, timing = run_phase(cells, n_samples=samples, seeds=seeds, seed=seed,
                                  cache_dir=cache_dir if cache_dir is not None else out / "cache",
                                  execution=execution)
        # the printed rows are built before publishing: a folder marked complete has a result
        rows = [{**{a: r.get(a) for a in names}, **{c: r.get(c) for c in JSON_COLUMNS}}
                for r in table.to_dict("records")]
        with staged(out, f"cells {len(table)}\n") as stage:
            written = write_report(table, names, stage, plot=plot_axes, meta={**meta, "timing": timing})
    paths = {k: ([_moved(p, stage, out) for p in v] if isinstance(v, list) else _moved(v, stage, out))
             for k, v in written.items()}
    if not print_result(fmt, {"cells": rows, "timing": timing, "files": paths}, rows):
        counts = table["regime"].value_counts().to_dict()
        typer.echo(f"{len(table)} cells ({timing['computed']} computed, {timing['wall_s']} s): {counts}")
        typer.echo(f"wrote {paths['report']}")
    for note in operator_notes(table):
        typer.echo(f"note: {note}", err=True)


def _moved(path: str, stage: Path, out: Path) -> str:
    """Where a file written under ``stage`` lies once published into ``out``."""
    return str(out / Path(path).relative_to(stage))
