"""`rankcollapse mask`: describe, draw and compare attention masks as graphs."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .. import masks  # lazy (PEP 562): `rankcollapse --help` imports no numerical library
from .._figure import save_figure
from .._io import atomic_path, check_writable
from .._memory import check_memory, influence_bytes, parse_size
from .._outdir import check_out, writing
from .._validate import check_int
from ..errors import ConfigError, MaskError
from ._boundary import given_flags
from ._output import ALLOW_NONEMPTY, FORMAT_HELP, check_format, make_table, print_json, print_result, print_table

IMAGE_SUFFIXES = (".png", ".pdf", ".svg")

mask_app = typer.Typer(help="Attention masks as graphs: token i attends to token j (M_ij = 1) is the edge j -> i.",
                       no_args_is_help=True)

_MEMORY_HELP = ("Memory the graph analysis may use, e.g. 32GiB (default half the RAM); "
                "larger complete/causal/window masks use their closed form instead.")
_SPEC_HELP = ("Mask spec: NAME or NAME:key=value,... (e.g. causal_sliding_window:w=4), "
              "file:PATH, composed with & and |; or a schedule of per-layer masks, "
              "schedule:MASK*k,MASK,... (e.g. schedule:sliding_window:w=9*5,complete).")


def _n_tokens(specs: List[str], n: Optional[int]) -> int:
    """``--n-tokens``, or the N the ``.npy`` mask files of ``specs`` fix (:func:`masks.spec_n_tokens`;
    one N for all of them)."""
    if n is not None:
        return check_int(n, "--n-tokens", low=1, error=MaskError)
    fixed = {spec: masks.spec_n_tokens(spec) for spec in specs}
    sizes = set(fixed.values()) - {None}
    if len(sizes) > 1:
        raise MaskError("mask files of different sizes: " + ", ".join(f"{s} (N={k})" for s, k in fixed.items() if k))
    if not sizes:
        raise MaskError(f"--n-tokens is needed for {', '.join(map(repr, specs))} "
                        "(only a .npy mask file fixes the number of tokens)")
    return sizes.pop()


@mask_app.command("describe")
def describe(
    spec: str = typer.Argument(..., help=_SPEC_HELP),
    n: Optional[int] = typer.Option(None, "--n-tokens", help="Number of tokens N (optional for a .npy mask "
                                    "file, whose shape fixes it)."),
    fmt: str = typer.Option("table", "--format", help="Output on stdout: table or json."),
    per_token: bool = typer.Option(False, "--per-token", help="Include each token's distance from the best center."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help=_MEMORY_HELP),
) -> None:
    """Graph analysis: centers, quasi-strong connectivity, radius, diameter, degrees.

    For a schedule: the composed graph of one period, plus period, per-layer predicted
    rate and each layer's description (layers)."""
    as_json = check_format(fmt, ("table", "json")) == "json"
    n = _n_tokens([spec], n)
    if masks.is_schedule(spec):
        from ..theory.rates import describe_schedule

        d = describe_schedule(spec, n, per_token=per_token)
        if as_json:
            print_json(d)
            return
        d = {k: v for k, v in d.items() if k != "layers"} | {"layers": [x["spec"] for x in d["layers"]]}
    else:
        d = masks.analyze(masks.parse_mask(spec, n), max_memory=parse_size(max_memory)).to_dict(per_token=per_token)
    if as_json:
        print_json(d)
        return
    rows = [(key, f"{value[:6]} ... ({len(value)} in all)" if isinstance(value, list) and len(value) > 12 else value)
            for key, value in d.items() if key != "spec"]
    print_table(make_table(f"mask {d['spec']}  (N = {n})", ("", ""), rows, show_header=False))


#: the drawings ``mask show`` writes: ``OUT/mask.png``, ``.pdf`` or ``.svg``
IMAGE_FORMATS = ("png", "pdf", "svg")


@mask_app.command("show")
def show(
    spec: str = typer.Argument(..., help=_SPEC_HELP),
    n: Optional[int] = typer.Option(None, "--n-tokens", help="Number of tokens N (at most 2048 for a drawing; "
                                    "optional for a .npy mask file, whose shape fixes it)."),
    out: Path = typer.Option(..., "--out", help="Output folder; the drawing is OUT/mask.png (or .pdf, .svg: "
                             "--image-format)."),
    image: str = typer.Option("png", "--image-format", help="png, pdf or svg."),
    allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    """Draw the mask: query tokens down, key tokens across, centers highlighted.
    A schedule draws its composed graph of one period."""
    n = _n_tokens([spec], n)
    if n > 2048:
        raise MaskError(f"--n-tokens {n} is too large to draw one cell per token pair (at most 2048)")
    if image not in IMAGE_FORMATS:  # the names --out may hold (rankcollapse._outdir.PRODUCED)
        raise ConfigError(f"--image-format must be one of {', '.join(IMAGE_FORMATS)}, got {image!r}")
    target = out / f"mask.{image}"
    check_out(out, [target.name], allow_nonempty=allow_nonempty, flags=True)  # before any work
    mask = masks.parse_schedule(spec, n).composed() if masks.is_schedule(spec) else masks.parse_mask(spec, n)
    # published beside the files earlier commands wrote there
    with writing(out, "mask show\n", [target.name], allow_nonempty=allow_nonempty, keep=True) as stage:
        masks.draw_mask(mask, masks.analyze(mask), stage / target.name)
    typer.echo(f"wrote {target}", err=True)


@mask_app.command("compare")
def compare(
    specs: List[str] = typer.Argument(..., help=_SPEC_HELP),
    n: Optional[int] = typer.Option(None, "--n-tokens", help="Number of tokens N (optional when a .npy mask "
                                    "file among the specs fixes it)."),
    d_qk: float = typer.Option(1.0, "--d-qk", help="Attention temperature d_QK (> 0)."),
    token_norm: float = typer.Option(1.0, "--token-norm", help="Bound R on token norms (1 under SA-LN)."),
    weight_norm: float = typer.Option(1.0, "--weight-norm", help="Bound C on ||W_Q||_2, ||W_K||_2."),
    exponent: str = typer.Option("t/r", "--exponent", help="Envelope exponent: t/r or t/(2r)."),
    fmt: str = typer.Option("table", "--format", help=FORMAT_HELP),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the table to the folder OUT as "
                                       "OUT/compare.csv."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help=_MEMORY_HELP),
    measure: bool = typer.Option(False, "--measure", help="Also simulate pure SA and rank by measured rate "
                                 "(schedule table; Haar W_V, Gaussian W_Q, W_K, float64)."),
    depth: int = typer.Option(60, "--depth", help="Layers simulated with --measure."),
    samples: int = typer.Option(8, "--n-samples", help="Samples simulated with --measure."),
    d_model: int = typer.Option(16, "--d-model", help="Token width d simulated with --measure."),
    seed: int = typer.Option(0, "--seed", help="Seed of --measure."),
    allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    """Compare masks by radius and the Theorem-1 per-layer contraction bound.

    With a schedule among the specs (or --measure): the schedule table, ranked by
    predicted (and measured) rate, with the mean attended pairs per layer as the cost;
    the envelope's exponent is e = min(p r_H, L) (L: scrambling length), so a schedule's
    bound does not depend on how it is written (complete and complete*5 agree)."""
    check_format(fmt)
    if d_qk <= 0:
        raise ConfigError(f"--d-qk must be > 0, got {d_qk}")
    schedules = measure or any(masks.is_schedule(s) for s in specs)
    # the simulation's settings apply with --measure only; --max-memory to the mask table only
    unused = [f for f in given_flags() if f in (("--max-memory",) if schedules else ())
              or (not measure and f in ("--depth", "--n-samples", "--d-model", "--seed"))]
    if unused:
        raise ConfigError(f"{unused[0]} does not apply here: " + ("the schedule table does not form the (N, N) graph"
                          if unused[0] == "--max-memory" else "it is a setting of --measure"))
    from ..theory.envelope import EXPONENTS  # here: numpy is not needed for --help
    from ..dynamics.config import RunConfig
    from ..theory.rates import compare_masks, compare_schedules

    if exponent not in EXPONENTS:  # before any work, for the schedule table too
        raise ConfigError(f"--exponent must be one of {', '.join(EXPONENTS)}, got {exponent!r}")
    if out is not None:
        check_out(out, ["compare.csv"], allow_nonempty=allow_nonempty, flags=True)
    n = _n_tokens(specs, n)
    if schedules:
        run = RunConfig(depth=check_int(depth, "--depth", low=1), seed=check_int(seed, "--seed", low=0))
        df = compare_schedules(specs, n, measure=run if measure else None, d_model=check_int(d_model, "--d-model", low=1),
                               n_samples=check_int(samples, "--n-samples", low=1), d_qk=d_qk, token_norm=token_norm,
                               weight_norm=weight_norm, exponent=exponent)
    else:
        df = compare_masks(specs, n, d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm, exponent=exponent,
                           max_memory=parse_size(max_memory))
    if out is not None:
        with writing(out, "mask compare\n", ["compare.csv"], allow_nonempty=allow_nonempty, keep=True) as stage, \
                atomic_path(stage / "compare.csv") as tmp:
            df.to_csv(tmp, index=False)
    rows = [{k: _plain(v) for k, v in r.items()} for r in df.to_dict(orient="records")]
    if print_result(fmt, rows, rows, df.columns):
        return
    print_table(make_table(f"masks at N = {n}, d_qk = {d_qk}, exponent {exponent}; "
                           "eps = Theorem-1 entry bound, factor = (1-eps^e)^(1/e), e = r for a mask, "
                           "min(p r_H, L) for a schedule", [_SHORT.get(col, col) for col in df.columns],
                           ([_fmt(v) for v in r] for r in df.itertuples(index=False))))


@mask_app.command("influence")
def influence_command(
    spec: str = typer.Argument(..., help=_SPEC_HELP),
    n: Optional[int] = typer.Option(None, "--n-tokens", help="Number of tokens N (optional for a .npy mask file, "
                                    "whose shape fixes it)."),
    depth: int = typer.Option(..., "--depth", help="Layers H (>= 1)."),
    alpha: float = typer.Option(..., "--alpha", help="Residual weight in [0, 1]: P = alpha I + (1 - alpha) A."),
    decay: float = typer.Option(0.0, "--decay", help="ALiBi-style slope m >= 0: key j of query i weighted "
                                "exp(-m |i - j|)."),
    query: str = typer.Option("last", "--query", help="last (the last query's profile) or all (also the "
                              "N x N matrix, N <= 1024; json only)."),
    epsilon: float = typer.Option(0.01, "--epsilon", help="Mass left out of the effective horizon, in (0, 1)."),
    fmt: str = typer.Option("table", "--format", help="Output on stdout: table (summaries) or json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw influence vs position, one curve per "
                                        "depth (log scale), to this .png, .pdf or .svg file."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Memory the profiles may use, e.g. "
                                             "32GiB (default half the RAM); checked before any work."),
) -> None:
    """Influence of each input position on the last query after H layers of uniform
    attention over the mask's keys with residual mixing: (P_H ... P_1)[N-1, :],
    P = alpha I + (1 - alpha) A (docs/masks.md, "Influence profiles")."""
    as_json = check_format(fmt, ("table", "json")) == "json"
    if query == "all" and not as_json:
        raise ConfigError("--query all prints the N x N matrix: use --format json")
    if plot is not None:
        if plot.suffix not in IMAGE_SUFFIXES:
            raise ConfigError(f"--plot must end in {', '.join(IMAGE_SUFFIXES)}, got {str(plot)!r}")
        check_writable(plot, folder=False)
    from ..masks.influence import draw_influence, influence

    n, depth, limit = _n_tokens([spec], n), check_int(depth, "--depth", low=1, error=MaskError), parse_size(max_memory)
    if as_json:  # the printed document too, before any work
        check_memory(influence_bytes(n, depth, query_all=query == "all", as_json=True),
                     f"the influence profile at N = {n}, depth {depth} as JSON", limit)
    result = influence(spec, n, depth=depth, alpha=alpha, decay=decay, query=query, epsilon=epsilon, max_memory=limit)
    if plot is not None:
        save_figure(draw_influence(result), plot)
        typer.echo(f"wrote {plot}", err=True)
    if as_json:
        print_json(result.to_dict())
        return
    cols = ["depth", *[k for k in result.summary if k != "mass"]]
    print_table(make_table(f"influence on the last query: {result.spec}, N = {result.n_tokens}, alpha = "
                           f"{result.alpha:g}, decay = {result.decay:g}, epsilon = {result.epsilon:g} "
                           f"({result.method})", cols, ([_fmt(row[c]) for c in cols] for row in result.per_depth)))


_SHORT = {"n_tokens": "N", "n_edges": "edges", "quasi_strongly_connected": "QSC", "n_centers": "centers", "radius": "r",
          "max_in_degree": "max keys", "epsilon_bound": "eps bound", "log10_factor": "log10 factor",
          "log10_layers_per_decade": "log10 layers/10x", "mean_edges_per_layer": "edges/layer",
          "log10_rate_per_layer": "log10 rate", "measured_rate": "measured", "rank_predicted": "rank pred",
          "rank_measured": "rank meas", "period_radius": "p r_H", "scrambling_length": "L", "effective_radius": "e"}


def _plain(v):
    """A JSON-ready scalar: numpy scalars unwrapped, NaN / NA as None."""
    import pandas as pd

    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return None
    return v.item() if hasattr(v, "item") else v


def _fmt(v) -> str:
    v = _plain(v)
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)
