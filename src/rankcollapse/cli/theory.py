"""`rankcollapse theory`: the paper's theorems checked numerically (docs/theory.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import typer

from .. import theory
from .._display import fixed
from .._io import read_user_json, write_json_atomic
from .._outdir import writing
from ..errors import ConfigError
from ._output import ALLOW_NONEMPTY, check_format, print_result

sub = typer.Typer(help="Theorems as code: collapse envelopes, SA-LN equilibria, stability, basins, portraits.",
                  no_args_is_help=True)


def _table_or_json(value: str) -> str:
    return check_format(value, ("table", "json"))


_FORMAT = typer.Option("table", "--format", callback=_table_or_json, help="stdout: table (text) or json.")


def _emit(obj: dict, fmt: str, lines: list[str], rows: Sequence[dict] = ()) -> None:
    """``obj`` as JSON, ``rows`` as CSV or markdown, or the text ``lines``."""
    if not print_result(fmt, obj, rows):
        typer.echo("\n".join(lines))


def _load_system(path: Path):
    return theory.AttentionSystem.from_dict(read_user_json(path, "system JSON", ConfigError))


def _numbers(text: str, flag: str, kind: type = int) -> tuple:
    """The comma-separated values of ``flag`` as ``kind`` (int or float)."""
    try:
        return tuple(kind(v) for v in text.split(","))
    except ValueError as exc:
        what = "integers" if kind is int else "numbers"
        raise ConfigError(f"{flag} must be comma-separated {what}, got {text!r}") from exc


def _n_tokens(mask: str | None, n: int | None, default: int) -> int:
    """``--n-tokens``, else the N a ``.npy`` mask file of ``--mask`` fixes, else ``default``."""
    if n is not None or not isinstance(mask, str):
        return default if n is None else n
    from ..masks import spec_n_tokens

    fixed_n = spec_n_tokens(mask)
    return default if fixed_n is None else fixed_n


@sub.command("bound")
def bound_cmd(
    n: Optional[int] = typer.Option(None, "--n-tokens", help="Number of tokens N (default 32; a .npy mask file: its N)."),
    widths: str = typer.Option("32,17,9,5,3,2", help="causal_sliding_window widths to sweep."),
    mask: Optional[str] = typer.Option(None, help="Check one mask spec instead of the sweep."),
    d: int = typer.Option(16, "--d-model", help="Token width d."), depth: int = typer.Option(60),
    samples: int = typer.Option(8, "--n-samples"), seed: int = typer.Option(0),
    exponent: str = typer.Option("t/r", help="'t/r' or 't/(2r)'."),
    fmt: str = typer.Option("table", "--format", help="stdout: table (text), json, or csv / markdown (the sweep)."),
) -> None:
    """Theorem 1: measured μ decay under pure SA vs the envelope C(1-ε^r)^{t/r}."""
    check_format(fmt)
    kw = dict(d_model=d, depth=depth, n_samples=samples, seed=seed, exponent=exponent)
    n = _n_tokens(mask, n, 32)
    if mask is not None:
        res = theory.check_collapse_bound(mask, n_tokens=n, **kw)
        exp = (f" L={res.config['scrambling_length']} e={res.config['effective_radius']}"
               if "effective_radius" in res.config else "")  # a schedule: the envelope's exponent e = min(p r_H, L)
        lines = [f"{res.mask}: r={res.radius}{exp} ε={float(res.epsilon_measured.median()):.3g} "
                 f"measured rate {fixed(res.measured_rate, '.4f')}/layer, envelope rate "
                 f"{fixed(res.envelope_rate, '.6f')}, violations {res.n_violations}"]
        _emit(res.to_dict(), fmt, lines + _loose_note([res.mask], [res.envelope_rate]), [res.to_dict()])
        return
    table = theory.radius_sweep(n, _numbers(widths, "--widths"), **kw)
    rows = table.to_dict(orient="records")
    ok = bool(table["holds"].all())
    lines = [table.to_string(index=False), "envelope holds everywhere" if ok else "ENVELOPE VIOLATED"]
    _emit({"sweep": rows, "all_hold": ok, "config": {"n": n, **kw}}, fmt,
          lines + _loose_note(list(table["mask"]), list(table["envelope_rate"])), rows)


#: A guaranteed per-layer factor above this says almost nothing about finite depth.
LOOSE_RATE = 0.999


def _loose_note(masks: list[str], rates: list[float]) -> list[str]:
    """One line naming the masks whose envelope is too loose to be informative."""
    loose = [m for m, r in zip(masks, rates) if r > LOOSE_RATE]
    return [] if not loose else [f"note: envelope too loose to be informative for {', '.join(loose)}: the guaranteed "
                                 f"per-layer factor is > {LOOSE_RATE} (μ may shrink by < 0.1 % a layer); the bound "
                                 f"holds but only says μ does not grow, not how fast it decays"]


@sub.command("equilibria")
def equilibria_cmd(
    n: int = typer.Option(2, "--n-tokens", help="Number of tokens N."),
    d: int = typer.Option(2, "--d-model", help="Token width d."), rank: int = typer.Option(2, "--rank"),
    limit: Optional[int] = typer.Option(None, help="List only this many (needed when 2^rank > 4096)."),
    example: bool = typer.Option(False, help="The N = d = 2 example of spec.md §5.3 instead."), fmt: str = _FORMAT,
) -> None:
    """A system with ≥ 2^rank SA-LN equilibria of rank exactly `rank`, each verified and classified."""
    es = theory.causal_example_2x2().with_stability() if example else theory.equilibria(n, d, rank, limit=limit)
    obj = es.to_dict()
    lines = [f"W_V = {obj['W_V']}", f"{len(es.equilibria)} equilibria (causal mask, W_Q = W_K = 0):"]
    labels = es.info.get("labels", [""] * len(es.equilibria))
    for e, label in zip(es.equilibria, labels):
        head = f"  {label}  " if label else "  "
        lines.append(f"{head}rank {e.rank}  stable={e.stable}  residual={e.residual:.1e}  "
                     f"unstable directions={e.stability.n_unstable}")
        if example or e.X.numel() <= 16:
            lines.append("    X = " + "; ".join("(" + ", ".join(fixed(v, "+.5f") for v in row) + ")" for row in e.X.tolist()))
    if "B" in es.info:
        b0, b1 = es.info["B"]
        lines.append(f"B = ((6-√6)/10, -(2+3√6)/10) = ({fixed(b0, '.5f')}, {fixed(b1, '.5f')}): token 1 of the stable rank-2 equilibria")
    _emit(obj, fmt, lines)


@sub.command("system")
def system_cmd(
    out: Path = typer.Option(..., "--out", help="Output folder; writes OUT/system.json."), fmt: str = _FORMAT,
    allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    """Write a system JSON for `theory find` and `theory basin`: the N = d = 2 causal example
    (spec.md §5.3: W_Q = W_K = 0, W_V = [[1, -3], [0, 2]]); edit it for other systems."""
    path = out / "system.json"
    with writing(out, "theory system\n", [path.name], allow_nonempty=allow_nonempty, keep=True) as stage:
        obj = theory.causal_example_2x2().system.to_dict()  # after --out is checked: torch is imported here
        write_json_atomic(stage / path.name, obj)
    _emit({"system": str(path), **obj}, fmt, [f"wrote {path}: N = d = 2 causal example (W_Q = W_K = 0, "
                                              f"W_V = {obj['W_V']}); use it with --system {path}"])


@sub.command("find")
def find_cmd(
    system: Path = typer.Option(..., help="System JSON: mask (bool (N,N) list or spec string like 'causal'), "
                                "W_Q, W_K (d,d_k), W_V (d,d), optional d_qk, n_tokens; "
                                "`theory system` and `theory equilibria --format json` write one."),
    starts: int = typer.Option(64), seed: int = typer.Option(0), fmt: str = _FORMAT,
) -> None:
    """Search equilibria of any system (damped fixed point + tangent Newton, many starts)."""
    res = theory.find_equilibria(_load_system(system), n_starts=starts, seed=seed)
    obj = {**res.to_dict(), "n_converged": res.n_converged, "n_starts": res.n_starts}
    _emit(obj, fmt, [f"{res.n_converged}/{res.n_starts} starts converged; {len(res.equilibria)} distinct"]
          + [f"  rank {e.rank} stable={e.stable} residual={e.residual:.1e}" for e in res.equilibria])


@sub.command("basin")
def basin_cmd(
    system: Optional[Path] = typer.Option(None, help="System JSON (schema as for `theory find`); "
                                          "default the N = d = 2 example."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Target rank; default min(N, d)."),
    samples: int = typer.Option(4000, "--n-samples"), seed: int = typer.Option(0), depth: int = typer.Option(400),
    confidence: float = typer.Option(0.95), method: str = typer.Option("wilson", help="'wilson' or 'exact'."),
    fmt: str = _FORMAT,
) -> None:
    """Monte Carlo fraction of uniform random starts ending at a rank-k equilibrium, with a CI."""
    used = _load_system(system) if system is not None else theory.causal_example_2x2().system
    b = theory.basin_estimate(used, target_rank=rank, n_samples=samples, seed=seed, depth=depth,
                       confidence=confidence, method=method)
    name = str(system) if system is not None else "the N = d = 2 causal example (docs/theory.md §3a)"
    where = (f"system {name}: N={used.n_tokens}, d={used.dim}, "
             f"W_V={[[round(v, 6) for v in row] for row in used.W_V.tolist()]}")
    _emit({**b.to_dict(), "system": {"source": name, **used.to_dict()}}, fmt, [where, f"rank-{b.target_rank} fraction {b.fraction:.4f} "
                                 f"({confidence:.0%} {method} CI {b.ci_low:.4f}-{b.ci_high:.4f}); "
                                 f"{b.n_samples} samples, seed {b.seed}, {b.depth} layers, final ranks {b.rank_counts}"])


@sub.command("sphere")
def sphere_cmd(
    mask: str = typer.Option("causal"),
    n: Optional[int] = typer.Option(None, "--n-tokens", help="Number of tokens N (default 16; a .npy mask file: its N)."),
    d: int = typer.Option(8, "--d-model", help="Token width d."),
    depth: int = typer.Option(80), beta: float = typer.Option(8.0), seed: int = typer.Option(0), fmt: str = _FORMAT,
) -> None:
    """Theorem 2: SA-LN with orthogonal W_V, inputs meeting vs violating the cosine condition."""
    n = _n_tokens(mask, n, 16)
    rs = [theory.check_sphere_collapse(mask, n_tokens=n, d_model=d, depth=depth, inputs=k, beta=beta, seed=seed)
          for k in theory.sphere.INPUTS]
    _emit({"results": [r.to_dict() for r in rs]}, fmt,
          [f"{r.inputs:12s} min cos(0)={fixed(r.min_cos0, '+.3f')} rate={fixed(r.measured_rate, '.4f')} final μ={r.final_mu:.3g} "
           f"collapsed={r.collapsed}" for r in rs])


@sub.command("portrait")
def portrait_cmd(
    out: Path = typer.Option(Path("runs/theory"), help="Folder for the PNGs."),
    seed: int = typer.Option(0), fmt: str = _FORMAT, allow_nonempty: bool = ALLOW_NONEMPTY,
) -> None:
    """N = d = 2 final angle vs starting angle, and d = 3 trajectories on the sphere (PNG)."""
    names = ["portrait_2d.png", "trajectories_3d.png"]
    p2, p3 = (out / name for name in names)
    with writing(out, "theory portrait\n", names, allow_nonempty=allow_nonempty, keep=True) as stage:
        data = theory.portrait_2d(stage / p2.name)
        theory.trajectories_3d(stage / p3.name, seed=seed)
    frac = float(data["rank2"][1].mean())
    _emit({"portrait_2d": str(p2), "trajectories_3d": str(p3), "rank2_arc_fraction": frac}, fmt,
          [f"wrote {p2} and {p3}; token 1 ends at rank 2 for {frac:.1%} of starting angles (token 0 at +(0,1))"])


@sub.command("clusters")
def clusters_cmd(
    beta: str = typer.Option("4,9", "--beta", help="Inverse temperatures, comma-separated."),
    n: int = typer.Option(128, "--n-tokens", help="Tokens N on the circle."),
    n_samples: int = typer.Option(20, "--n-samples", help="Uniform random starts per beta (one batch, --seed)."),
    step: float = typer.Option(0.1, "--step", help="Euler step h of the flow."),
    depth: int = typer.Option(1500, "--depth", help="Layers (time depth * h)."),
    angle: float = typer.Option(0.1, "--angle", help="Cluster link angle in radians."),
    min_plateau: int = typer.Option(100, "--min-plateau", help="Layers a count must hold to be a plateau."),
    seed: int = typer.Option(0), fmt: str = _FORMAT,
) -> None:
    """Metastable clusters on the circle: the first plateau's cluster count against argmax_k k^2 I_k(beta)."""
    from ..theory.clusters import check_beta

    betas = [check_beta(b) for b in _numbers(beta, "--beta", float)]  # every value before the first run
    rs = [theory.circle_clusters(b, n_tokens=n, n_samples=n_samples, step=step, depth=depth, angle=angle,
                                 min_plateau=min_plateau, seed=seed) for b in betas]
    _emit({"results": [r.to_dict() for r in rs]}, fmt,
          [f"beta={r.beta:g}: predicted {r.predicted} clusters; first plateau {r.plateau_counts} "
           f"(-1 = none, {n_samples - r.n_plateaus} of {n_samples}); agreement {r.agreement:.2f} over all "
           f"{n_samples} starts" for r in rs])


@sub.command("temperature")
def temperature_cmd(
    law: str = typer.Option("log:1,pow:1,ssmax:1,llama4", "--law",
                            help="Temperature laws, comma-separated: log:γ (β = γ ln N), pow:c (β = c N^(2/(d-1))), "
                                 "ssmax:s (β = s ln N / sqrt d), llama4 (docs/phase.md, Temperature laws)."),
    n: str = typer.Option("1000,10000,100000", "--n-tokens", help="Numbers of keys N, comma-separated."),
    keys: str = typer.Option("sphere", "--keys", help="Key distribution, an input name (sphere: i.i.d. uniform on "
                             "S^(d-1); simplex, ...)."),
    d: int = typer.Option(3, "--d-model", help="Width d."),
    queries: int = typer.Option(64, "--n-queries", help="Queries per N, each with its own keys."),
    query: str = typer.Option("fresh", "--query", help="fresh (a new draw, independent of the keys) or key "
                              "(key 0 itself: a self-attention row)."),
    seed: int = typer.Option(0), fmt: str = typer.Option("table", "--format", help="stdout: table, json, csv or markdown."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Memory one query's tokens may take, e.g. "
                                             "8GiB; default half the RAM."),
) -> None:
    """Participation ratio 1/sum_j a_j^2 of one query over N keys per temperature law, and its growth exponent in N."""
    from ..theory.temperature import participation_scan

    check_format(fmt)
    scan = participation_scan([v.strip() for v in law.split(",")], _numbers(n, "--n-tokens"), keys=keys, d_model=d,
                              n_queries=queries, query=query, seed=seed, max_memory=max_memory)
    lines = [f"participation ratio of one {query} query over N {keys} keys, d = {d}, {queries} queries per N "
             f"(mean [95% t-interval])", f"{'N':>8}  {'law':<12} {'beta':>10}  PR"]
    lines += [f"{r['n_tokens']:>8}  {r['law']:<12} {r['beta']:>10.4g}  {r['pr_mean']:.4g} "
              f"[{r['pr_lo']:.4g}, {r['pr_hi']:.4g}]" for r in scan.rows]
    if len(set(scan.config["n_tokens"])) < 2:  # the slopes are NaN (null in JSON)
        lines += ["growth exponent of mean PR in N: undefined with one N (give two or more --n-tokens)"]
    else:
        lines += ["growth exponent of mean PR in N (slope of ln PR on ln N [95% bootstrap]):"]
        lines += [f"  {s['law']:<12} {fixed(s['slope'], '+.3f')} [{fixed(s['slope_lo'], '+.3f')}, "
                  f"{fixed(s['slope_hi'], '+.3f')}]" for s in scan.slopes]
    _emit(scan.to_dict(), fmt, lines, scan.rows)
