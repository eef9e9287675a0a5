"""Run experiments: expand configs into units, compute the missing ones (cache keyed by
unit hash, one Parquet file per unit written atomically, so an interrupted run resumes),
assemble the tidy table, evaluate the claims, run nearby settings for claims not
reproduced, and write the outputs. ``COMPLETE`` is written last: a folder without it
is not a finished run.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from .._io import atomic_path, config_hash, versions, write_json_atomic, write_text_atomic
from ..errors import ConfigError, DataError
from . import claims as claims_mod
from .config import (Unit, claim_depth, effective_override, expand_units, load_config, resolve_names, setting_label,
                     with_override)
from .context import RunContext, data_spec
from .table import normalise
from .units import EXECUTORS, _norm_of, mask_name

log = logging.getLogger(__name__)
MARKER = "COMPLETE"
#: Metrics recorded by nearby-setting runs: the ones the claim rules read.
NEARBY_METRICS = ("mu", "mu_relative")


@dataclass
class RunResult:
    """What :func:`run_experiment` produced."""

    out: Path
    table: pd.DataFrame
    claims: list[dict[str, Any]]
    config: dict[str, Any]
    timings: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def default_cache_dir(out: Path) -> Path:
    """Cache shared by sibling run folders: ``<out>/../.rankcollapse-cache``."""
    return Path(out).resolve().parent / ".rankcollapse-cache"


def check_overrides(overrides: dict[str, Any], length: int) -> None:
    """Validate command-line overrides before anything is written.

    Raises
    ------
    MaskError, ConfigError
        A mask spec that does not parse for ``length`` tokens, or a count < 1.
    """
    from ..masks import parse_mask

    for spec in overrides.get("masks") or ():
        parse_mask(spec, length)
    for key, option in (("depth", "--depth"), ("n_windows", "--windows")):
        if overrides.get(key) is not None and int(overrides[key]) < 1:
            raise ConfigError(f"{option} must be >= 1, got {overrides[key]}")


def plan(name: str | None, scale: str, seed: int, *, text: str | Path | None = None, length: int = 128,
         overrides: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[Unit], dict[str, Any]]:
    """Configs, de-duplicated units and the data spec of a run (validates everything)."""
    overrides = overrides or {}
    cfgs = [load_config(n) for n in resolve_names(name)]
    data = data_spec(text, length, seed)
    check_overrides(overrides, length)
    units: dict[str, Unit] = {}
    for cfg in cfgs:
        for u in expand_units(cfg, scale, seed, data=data, overrides=overrides):
            units.setdefault(u.hash, u)
    return cfgs, list(units.values()), data


def compute_units(units: Iterable[Unit], ctx: RunContext, cache: Path, *, progress: bool = True,
                  title: str = "units") -> tuple[pd.DataFrame, list[dict]]:
    """Tidy rows of every unit, computing only those missing from ``cache``.

    Progress goes to stderr: a live bar on a terminal; otherwise (a log file, a pipe)
    one line per call once the group is done, so logs stay short.
    """
    units = list(units)
    frames, timings = {}, []
    cache.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with _progress(progress and _stderr_is_tty()) as bar:
        task = bar.add_task(title, total=len(units)) if bar else None
        for i in sorted(range(len(units)), key=lambda k: _share_key(units[k])):
            u = units[i]
            path = cache / f"{u.kind}-{u.hash}.parquet"
            t0, c0 = time.perf_counter(), time.process_time()
            if bar:
                bar.update(task, description=_short(f"{title}: {u.label}", 70))
            if path.exists():
                df, cached = pd.read_parquet(path), True
            else:
                df = EXECUTORS[u.kind](u, ctx)
                with atomic_path(path) as tmp:
                    df.to_parquet(tmp, index=False)
                cached = False
            frames[i] = df.assign(experiment=u.experiment)
            timings.append({"unit": u.label, "hash": u.hash, "cached": cached, "seconds": round(time.perf_counter() - t0, 3),
                            "cpu_seconds": round(time.process_time() - c0, 3)})
            if bar:
                bar.advance(task)
    if progress and not _stderr_is_tty() and units:
        n_cached = sum(t["cached"] for t in timings)
        print(f"{title}: {len(units)} units ({n_cached} cached) in {time.perf_counter() - t_start:.1f} s",
              file=sys.stderr, flush=True)
    frames = [frames[i] for i in range(len(units))]  # table rows in unit order, whatever the compute order
    table = normalise(pd.concat(frames, ignore_index=True)) if frames else normalise(pd.DataFrame())
    return table, timings


def _stderr_is_tty() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _short(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis (rich's bar column is fixed)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _share_key(u: Unit) -> tuple:
    """Compute order: units that share inputs and weights (same kind, model, families,
    seed) run one after another, so the run context's small weight cache hits."""
    p = u.params
    return (u.kind, str(p.get("model", "")), str(p.get("value", "")), str(p.get("init_scale", "")),
            int(p.get("seed", -1)), int(p.get("depth", 0)))


def _progress(enabled: bool):
    from contextlib import nullcontext

    if not enabled:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description:<70}"), BarColumn(bar_width=20), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=False)


def evaluate_claims(cfgs: list[dict[str, Any]], table: pd.DataFrame, scale: str = "",
                    overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Claims of every config, evaluated on ``table`` under the default setting, at the
    claim depth and at twice it. A ``main`` run lists only the claims it can decide
    (``claims_from`` configs contribute the claims its rows decide); a claim of the
    experiment's own config that cannot be decided is kept and names its missing inputs."""
    out = {}
    excluded = tuple(m for c in cfgs for m in c["scales"].get(scale, {}).get("exclude_models", ()))
    own = {c["name"] for c in cfgs}
    for cfg in claim_sources(cfgs):
        depth = claim_depth(cfg, scale, overrides) if scale in cfg["scales"] else None
        for claim in cfg.get("claims", []):
            res = claims_mod.evaluate_claim(table, claim, depth=depth)
            if res["verdict"] == "not run" and cfg["name"] not in own and not (overrides or {}).get("masks"):
                continue  # borrowed claim this run has no rows for
            out.setdefault(claim["id"], claims_mod.claim_record(claim, cfg["name"], res, excluded_models=excluded, scale=scale))
    return sorted(out.values(), key=lambda c: c["id"])


def claim_sources(cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configs whose claims a run evaluates: its own plus their ``claims_from``."""
    names = [c["name"] for c in cfgs]
    extra = [n for c in cfgs for n in c.get("claims_from", []) if n not in names]
    return list(cfgs) + [load_config(n) for n in dict.fromkeys(extra)]


def nearby_units(cfg: dict[str, Any], claim: dict[str, Any], units: list[Unit]
                 ) -> list[tuple[str, dict, list[Unit], list[Unit]]]:
    """For each pre-registered nearby setting of ``claim``: (label, override, units to
    run, units reused unchanged). A setting changes only the units where it means
    something (:func:`~.config.effective_override`); the others keep their default rows."""
    filt = claim.get("nearby_units", {})
    # nearby settings are a first look: one weight seed (the run's first)
    first = min((int(u.params.get("seed", -1)) for u in units if u.kind == "simulate"), default=-1)
    base = [u for u in units if u.params.get("setting") == "default" and _unit_matches(u, filt)
            and int(u.params.get("seed", -1)) in (first, -1)]
    out = []
    for override in claim.get("nearby", []):
        label = setting_label(override)
        changed, reused = [], []
        for u in base:
            eff = effective_override(u, override)
            if not eff:
                reused.append(u)
                continue
            if u.kind in ("simulate", "pretrained_sa"):
                # a first look records only what the rules read (mu, mu_relative)
                eff = {**eff, "metrics": list(NEARBY_METRICS)}
            changed.append(with_override(u, eff, label))
        out.append((label, override, changed, reused))
    return out


def _unit_matches(u: Unit, filt: dict[str, Any]) -> bool:
    for k, want in filt.items():
        wants = [str(w) for w in (want if isinstance(want, list) else [want])]
        have = (u.kind if k == "kind" else mask_name(u.params.get("mask", "")) if k == "mask"
                else _norm_of(u.params) if k == "norm" else float(u.params.get("radius", 1.0)) if k == "radius"
                else u.params.get(k, ""))
        if str(have) not in wants:
            return False
    return True


def run_nearby(cfgs: list[dict[str, Any]], records: list[dict[str, Any]], units: list[Unit], ctx: RunContext,
               cache: Path, *, progress: bool, default: pd.DataFrame) -> tuple[pd.DataFrame | None, list[dict]]:
    """Run the nearby settings of every claim the run decided (whatever its default
    verdict: a setting shows where the verdict holds) and attach their verdicts. Rows of units a setting does not
    change (theory checks, or a unit where the setting is meaningless) are read from the
    ``default`` table. A unit shared by several claims (same hash) is computed and
    tabled once; its ``claims`` column lists the claims that read it."""
    by_id = {r["id"]: r for r in records}
    frames: dict[str, pd.DataFrame] = {}
    users: dict[str, list[str]] = {}
    timings: list[dict] = []
    for cfg in claim_sources(cfgs):
        for claim in cfg.get("claims", []):
            rec = by_id.get(claim["id"])
            if rec is None or rec["verdict"] == "not run":
                continue
            for label, override, nunits, reused in nearby_units(cfg, claim, units):
                if not nunits:
                    continue
                todo = [u for u in nunits if u.hash not in frames]
                if todo:
                    table, tim = compute_units(todo, ctx, cache, progress=progress, title=f"{claim['id']} {label}")
                    frames.update({h: g for h, g in table.groupby("unit", sort=False)})
                    timings += tim
                for u in nunits:
                    users.setdefault(u.hash, []).append(claim["id"])
                base = {u.hash for u in units if _unit_matches(u, claim.get("nearby_units", {}))}
                keep = ~default["unit"].isin(base) | default["unit"].isin({u.hash for u in reused})
                kept = default[keep].assign(setting=label)
                rows = pd.concat([frames[u.hash] for u in nunits] + [kept], ignore_index=True)
                res = claims_mod.evaluate_claim(rows, claim, setting=label, override=override, depth=rec["depth"])
                rec["nearby"].append({"setting": label, "verdict": res["verdict"], "measured": res["measured"],
                                      "interval": res["interval"], "checks": res["checks"],
                                      **({"missing": res["missing"]} if "missing" in res else {})})
    if not frames:
        return None, timings
    table = pd.concat([g.assign(claims=",".join(dict.fromkeys(users[h]))) for h, g in frames.items()], ignore_index=True)
    return table, timings


def run_experiment(name: str | None = "main", scale: str = "quick", out: str | Path | None = None, seed: int = 0, *,
                   text: str | Path | None = None, length: int = 128, cache_dir: str | Path | None = None,
                   overrides: dict[str, Any] | None = None, device: str = "cpu", progress: bool = True,
                   nearby: bool = True, write: bool = True) -> RunResult:
    """Run experiment ``name`` (``main``, ``fig2``, ``fig3``, ``fig4``, ``theory`` or ``all``).

    Parameters
    ----------
    scale : ``quick`` (minutes on 2 cores), ``paper`` (3000 windows) or ``smoke`` (tests).
    out : output folder (default ``runs/<UTC time>``).
    seed : seeds the window order and (``seed + k``) the weights of seed ``k``.
    text : a UTF-8 text file (one document per line) or JSONL instead of Wikipedia.
    length : tokens per window (N).
    overrides : ``masks`` (list of specs), ``depth``, ``n_windows``, ``extra_models``.
    nearby : run the pre-registered nearby settings of claims not reproduced.

    Raises
    ------
    ConfigError, MaskError, DataError, AssetMissingError
        Bad input, raised before the output folder is created.
    """
    t0 = time.perf_counter()
    cfgs, units, data = plan(name, scale, seed, text=text, length=length, overrides=overrides)
    ctx = RunContext(data, device)
    out = Path(out) if out is not None else Path("runs") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(out)
    _preflight(ctx, [u for u in units if not (cache / f"{u.kind}-{u.hash}.parquet").exists()])
    if write:
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).unlink(missing_ok=True)
    table, timings = compute_units(units, ctx, cache, progress=progress, title="/".join(c["name"] for c in cfgs))
    records = evaluate_claims(cfgs, table, scale, overrides)
    near, near_t = run_nearby(cfgs, records, units, ctx, cache, progress=progress, default=table) if nearby else (None, [])
    if near is not None:
        table = normalise(pd.concat([table, near], ignore_index=True))
    config = run_config(cfgs, scale, seed, data, overrides or {}, units)
    result = RunResult(out, table, records, config, timings + near_t, time.perf_counter() - t0)
    if write:
        write_outputs(result)
    return result


def _preflight(ctx: RunContext, units: list[Unit]) -> None:
    """Load every model the units to compute need and cut their windows before anything
    is written, so a missing model or a text that is too short fails with one line and
    no output folder. Cached units need nothing: their inputs were valid when computed
    (the unit hash covers the data)."""
    need: dict[str, int] = {}
    for u in units:
        if "n_windows" in u.params and u.params.get("model"):
            need[u.params["model"]] = max(need.get(u.params["model"], 0), int(u.params["n_windows"]))
    try:
        for model, n in need.items():
            ctx.windows(model, n)
    except DataError as exc:
        if ctx.data["corpus"] != "file":
            raise
        raise DataError(f"{ctx.data['path']}: {exc}") from None


def run_config(cfgs, scale, seed, data, overrides, units) -> dict[str, Any]:
    """``config.json`` content: configs, options, unit hashes, run hash, versions."""
    body = {"experiments": [c["name"] for c in cfgs], "scale": scale, "seed": seed, "data": data,
            "overrides": overrides, "configs": cfgs}
    return {**body, "config_hash": config_hash(body), "units": {u.hash: u.label for u in units}, "versions": versions()}


def write_outputs(result: RunResult) -> None:
    """Table (Parquet + CSV), plots, claims.json, config.json, report, then the marker."""
    from . import report
    from . import plots

    out = result.out
    with atomic_path(out / "table.parquet") as tmp:
        result.table.to_parquet(tmp, index=False)
    with atomic_path(out / "table.csv") as tmp:
        result.table.drop(columns=["values"], errors="ignore").to_csv(tmp, index=False)
    figures = plots.make_plots(result.table, result.config["configs"], out / "plots")
    write_json_atomic(out / "claims.json", result.claims)
    write_json_atomic(out / "config.json", {**result.config, "timings": result.timings,
                                            "seconds": round(result.seconds, 2)})
    write_text_atomic(out / "report.html", report.render_html(result, figures))
    write_text_atomic(out / "report.md", report.render_markdown(result, figures))
    write_text_atomic(out / MARKER, f"config_hash {result.config['config_hash']}\n")


def recheck(out: str | Path) -> list[tuple[str, str, str]]:
    """Recompute every verdict of a finished run from its stored ``table.parquet`` and
    the rules stored in its ``config.json``: ``[(id, stored, recomputed)]``."""
    import json

    out = Path(out)
    config = json.loads((out / "config.json").read_text())
    stored = {c["id"]: c for c in json.loads((out / "claims.json").read_text())}
    table = pd.read_parquet(out / "table.parquet")
    rules = {}
    for cfg in config["configs"] + [load_config(n) for c in config["configs"] for n in c.get("claims_from", [])]:
        for claim in cfg.get("claims", []):
            rules.setdefault(claim["id"], claim)
    return [(cid, stored[cid]["verdict"], claims_mod.evaluate_claim(table, rules[cid], depth=stored[cid].get("depth"))["verdict"])
            for cid in sorted(stored)]
