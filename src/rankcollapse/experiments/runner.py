"""Run experiments: expand configs into units, compute the missing ones on the run's
executor (:mod:`.executors`; cache in :mod:`.cache`, one Parquet file per unit written
atomically, so an interrupted run resumes), assemble the tidy table in unit order,
evaluate the claims, run nearby settings for claims not reproduced, and write the
outputs into a folder the run owns (:mod:`.outdir`). ``COMPLETE`` is written last: a
folder without it is not a finished run.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterable, Iterator

import pandas as pd

from .._io import atomic_path, check_writable, config_hash, numerics_key, versions, write_json_atomic, write_text_atomic
from .._validate import check_device, check_int
from ..errors import ConfigError, DataError
from ..models.probe import check_positions
from . import claims as claims_mod
from .controls import evaluate_controls
from .config import (Unit, claim_depth, claim_sources, effective_override, expand_units, load_config, resolve_names, setting_label,
                     with_override)
from .cache import UnitCache, as_cache
from .context import RunContext, data_spec
from .executors import SerialExecutor, check_executor, make_executor
from .outdir import OutputFolder, remove_unwritten, snapshot
from . import report
from .progress import UnitProgress
from .result import RunResult
from .table import normalise
from .units import EXECUTORS, _norm_of, mask_name

log = logging.getLogger(__name__)
MARKER = "COMPLETE"
#: Metrics recorded by nearby-setting runs: the ones the claim rules read.
NEARBY_METRICS = ("mu", "mu_relative")
_EXECUTOR: ContextVar[Any] = ContextVar("rankcollapse_executor", default=None)


def default_cache_dir(out: Path) -> Path:
    """Cache shared by sibling run folders: ``<out>/../.rankcollapse-cache``."""
    return Path(out).resolve().parent / ".rankcollapse-cache"


def check_overrides(overrides: dict[str, Any], length: int) -> None:
    """Validate command-line overrides before anything is written.

    Raises
    ------
    MaskError, ConfigError
        A mask spec that does not parse for ``length`` tokens, or a count that is
        not an integer >= 1.
    """
    from ..masks import parse_mask

    for spec in overrides.get("masks") or ():
        parse_mask(spec, length)
    for key, option in (("depth", "--depth"), ("n_windows", "--samples")):
        if overrides.get(key) is not None:
            check_int(overrides[key], option, low=1)


def plan(name: str | None, scale: str, seed: int, *, text: str | Path | None = None, length: int = 128,
         overrides: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[Unit], dict[str, Any]]:
    """Configs, de-duplicated units and the data spec of a run (validates everything).

    Raises
    ------
    ConfigError, MaskError, DataError
        ``seed`` not an integer >= 0, bad overrides (:func:`check_overrides`), an
        unknown experiment or scale, an unreadable text file.
    """
    seed = check_int(seed, "--seed", low=0)
    overrides = overrides or {}
    cfgs = [load_config(n) for n in resolve_names(name)]
    data = data_spec(text, length, seed)
    check_overrides(overrides, length)
    units: dict[str, Unit] = {}
    for cfg in cfgs:
        for u in expand_units(cfg, scale, seed, data=data, overrides=overrides):
            units.setdefault(u.hash, u)
    return cfgs, list(units.values()), data


def compute_units(units: Iterable[Unit], ctx: RunContext, cache: Path | UnitCache, *, progress: bool = True,
                  title: str = "units", executor: Any = None) -> tuple[pd.DataFrame, list[dict]]:
    """Tidy rows of every unit, computing only those missing from ``cache``.

    Parameters
    ----------
    cache : a cache folder or a :class:`~.cache.UnitCache` (``recompute`` forces).
    executor : where units run (:mod:`.executors`); default: the run's executor
        (:func:`using_executor`), or serial in this process.

    Returns
    -------
    (table, timings) : the normalised table, rows in the order of ``units`` whatever
        the order units finish in; one timing record per unit (wall and CPU seconds
        measured where the unit ran, ``cached``, ``worker``).

    Progress goes to stderr (:mod:`.progress`). Each computed unit is written to the
    cache as soon as it arrives, so an interrupted run loses only the units in flight.
    """
    units = list(units)
    cache = as_cache(cache)
    executor = executor or _EXECUTOR.get() or SerialExecutor()
    frames: dict[int, pd.DataFrame] = {}
    timings: dict[int, dict] = {}
    todo = []
    for i in sorted(range(len(units)), key=lambda k: _share_key(units[k])):
        u = units[i]
        t0 = time.perf_counter()
        df = cache.get(u)
        if df is None:
            todo.append(i)
            continue
        frames[i] = df
        timings[i] = _timing(u, True, time.perf_counter() - t0, 0.0, "cache")
    with UnitProgress(title, len(units), enabled=progress) as bar:
        bar.start(len(frames), len(todo), getattr(executor, "workers", 1), executor.name)
        if todo:
            bar.running(units[todo[0]].label)
        for done in executor.map([units[i] for i in todo], ctx, EXECUTORS):
            i = todo[done.index]
            cache.put(units[i], done.frame)
            frames[i] = done.frame
            timings[i] = _timing(units[i], False, done.wall, done.cpu, done.worker)
            bar.finished(units[i].label, done.wall, done.worker)
            left = [k for k in todo if k not in frames]
            if left:
                bar.running(units[left[0]].label)
    # table rows in unit order, whatever the compute order
    parts = [frames[i].assign(experiment=units[i].experiment) for i in range(len(units))]
    table = normalise(pd.concat(parts, ignore_index=True)) if parts else normalise(pd.DataFrame())
    return table, [timings[i] for i in sorted(timings, key=lambda k: _share_key(units[k]))]


def _timing(u: Unit, cached: bool, wall: float, cpu: float, worker: str) -> dict[str, Any]:
    return {"unit": u.label, "hash": u.hash, "kind": u.kind, "cached": cached, "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3), "worker": worker}


@contextmanager
def using_executor(executor: Any) -> Iterator[Any]:
    """Make ``executor`` the default of :func:`compute_units` inside the block (every
    group of a run, nearby settings included, runs on the run's executor)."""
    token = _EXECUTOR.set(executor)
    try:
        yield executor
    finally:
        _EXECUTOR.reset(token)


def _share_key(u: Unit) -> tuple:
    """Compute order: units that share inputs and weights (same kind, model, families,
    seed) run one after another, so the run context's small weight cache hits."""
    p = u.params
    return (u.kind, str(p.get("model", "")), str(p.get("value", "")), str(p.get("init_scale", "")),
            int(p.get("seed", -1)), int(p.get("depth", 0)))


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
            if claim["id"] in out:
                continue
            ctl = evaluate_controls(table, claim, depth=depth)
            out[claim["id"]] = claims_mod.claim_record(claim, cfg["name"], res, excluded_models=excluded, scale=scale,
                                                       controls=ctl)
    return sorted(out.values(), key=lambda c: c["id"])


def nearby_units(cfg: dict[str, Any], claim: dict[str, Any], units: list[Unit]
                 ) -> list[tuple[str, dict, list[Unit], list[Unit]]]:
    """For each pre-registered nearby setting of ``claim``: (label, override, units to
    run, units reused unchanged). A setting changes only the units where it means
    something (:func:`~.config.effective_override`); the others keep their default rows."""
    filt = claim.get("nearby_units", {})
    # nearby settings are a first look: one weight seed (the run's first)
    first = min((int(u.params.get("seed", -1)) for u in units if u.kind == "simulate"), default=-1)
    # control units (params role: control) serve the controls only, not nearby settings
    base = [u for u in units if u.params.get("setting") == "default" and _unit_matches(u, filt)
            and int(u.params.get("seed", -1)) in (first, -1) and u.params.get("role") != "control"]
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
                   nearby: bool = True, write: bool = True, executor: str = "serial", workers: int | None = None,
                   address: str | None = None, recompute: bool = False, wait: bool = False) -> RunResult:
    """Run experiment ``name`` (``main``, ``fig2``, ``fig3``, ``fig4``, ``theory`` or ``all``).

    Parameters
    ----------
    scale : ``quick`` (minutes on 2 cores), ``paper`` (3000 windows) or ``smoke`` (tests).
    out : output folder (default ``runs/<UTC time>``); held exclusively while the run lives.
    seed : seeds the window order and (``seed + k``) the weights of seed ``k``.
    text : a UTF-8 text file (one document per line) or JSONL instead of Wikipedia.
    length : tokens per window (N).
    overrides : ``masks`` (list of specs), ``depth``, ``n_windows``, ``extra_models``.
    nearby : run the pre-registered nearby settings of claims not reproduced.
    executor, workers, address : where units run (:func:`.executors.make_executor`);
        the numbers do not depend on them.
    recompute : recompute every unit of the run and overwrite its cache entries.
    wait : if another run holds ``out``, wait for it instead of failing.

    Raises
    ------
    ConfigError, MaskError, DataError, AssetMissingError, ModelError
        Bad input (a negative seed, an unknown or absent device, an ``out`` or
        ``cache_dir`` that cannot be a folder, windows longer than a model's positions),
        raised before the output folder or any cache entry is created.
    OutputBusyError
        Another live run holds ``out`` (and ``wait`` is false).
    """
    t0 = time.perf_counter()
    # every argument is checked before the first write (output folder, cache entry)
    seed = check_int(seed, "--seed", low=0)
    length = check_int(length, "--n-tokens", low=2)
    device = str(check_device(device))
    cfgs, units, data = plan(name, scale, seed, text=text, length=length, overrides=overrides)
    ctx = RunContext(data, device)
    out = Path(out) if out is not None else Path("runs") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    cache = UnitCache(Path(cache_dir) if cache_dir is not None else default_cache_dir(out), recompute=recompute)
    if write:
        check_writable(out, folder=True, option="--out")
    check_writable(cache.root, folder=True, option="--cache-dir")
    check_executor(executor, workers=workers, address=address)
    cache.remove_orphans()  # temporary files of writers that died a day ago or more
    _preflight(ctx, [u for u in units if not cache.has(u)])
    with ExitStack() as stack:
        if write:
            stack.enter_context(OutputFolder(out, wait=wait))
            (out / MARKER).unlink(missing_ok=True)
        ex = make_executor(executor, workers=workers, address=address, data=data, device=device)
        stack.callback(ex.close)
        stack.enter_context(using_executor(ex))
        table, timings = compute_units(units, ctx, cache, progress=progress, title="/".join(c["name"] for c in cfgs))
        records = evaluate_claims(cfgs, table, scale, overrides)
        near, near_t = run_nearby(cfgs, records, units, ctx, cache, progress=progress, default=table) if nearby else (None, [])
        if near is not None:
            table = normalise(pd.concat([table, near], ignore_index=True))
        config = run_config(cfgs, scale, seed, data, overrides or {}, units)
        config["execution"] = {"executor": ex.name, "workers": getattr(ex, "workers", 1), "numerics": numerics_key(),
                               "cache": str(cache.root)}
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
            check_positions(ctx.model(model), ctx.data["length"])
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
    """Table (Parquet + CSV), plots, claims.json, config.json, report, then the marker.
    Outputs of an earlier run that this one did not rewrite (plots of a different
    experiment, orphan temporary files) are removed before the marker is written, so a
    folder marked ``COMPLETE`` holds one run's outputs only. The caller holds the folder
    (:class:`~.outdir.OutputFolder`)."""
    from . import plots

    out = result.out
    before = snapshot(out)
    (out / MARKER).unlink(missing_ok=True)
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
    remove_unwritten(out, before)
    write_text_atomic(out / MARKER, f"config_hash {result.config['config_hash']}\n")


def recheck(out: str | Path) -> list[tuple[str, str, str]]:
    """Recompute every verdict of a finished run from its stored ``table.parquet`` and
    the rules stored in its ``config.json``: ``[(id, stored, recomputed)]``.

    Raises
    ------
    ConfigError
        ``out`` is not a finished run folder (names the missing file).
    """
    import json

    out = Path(out)
    for name in ("config.json", "claims.json", "table.parquet"):
        if not (out / name).is_file():
            raise ConfigError(f"{str(out)!r} is not a finished run folder: no {name} in it")
    config = json.loads((out / "config.json").read_text())
    stored = {c["id"]: c for c in json.loads((out / "claims.json").read_text())}
    table = pd.read_parquet(out / "table.parquet")
    rules = {}
    for cfg in config["configs"] + [load_config(n) for c in config["configs"] for n in c.get("claims_from", [])]:
        for claim in cfg.get("claims", []):
            rules.setdefault(claim["id"], claim)
    return [(cid, stored[cid]["verdict"], claims_mod.evaluate_claim(table, rules[cid], depth=stored[cid].get("depth"))["verdict"])
            for cid in sorted(stored)]
