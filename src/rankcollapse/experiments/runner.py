"""Run experiments: expand configs into units, compute the missing ones into the unit
cache (:func:`rankcollapse.sweep.run_units`), assemble the tidy table, decide the claims,
run nearby settings and write the outputs (``COMPLETE`` last) into a folder the run owns.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import pandas as pd

from .._io import atomic_path, check_writable, config_hash, versions, write_json_atomic, write_text_atomic
from .._outdir import OUTPUT_NAMES, OutputFolder, check_out, staged
from .._validate import check_device, check_int
from ..errors import ConfigError, DataError
from ..masks import parse_mask
from ..models.probe import check_positions
from ..models.source import check_model_source
from ..sweep.cache import UnitCache
from ..sweep.context import RunContext, data_spec
from ..sweep.engine import run_units
from ..sweep.executors import ExecutionConfig, check_ray_reachable, make_executor
from ..sweep.progress import UnitProgress
from ..sweep.units import Shard, Unit, numerics_key, unit_labels
from . import claims as claims_mod
from .audit import read_run, run_rules
from .axis import axis_units, claims_with_axes
from .controls import assess, evaluate_controls
from .cost import estimate, estimate_lines, shard_units
from .config import (MODEL_KINDS, OVERRIDE_KEYS, claim_depth, claim_sources, expand_units, load_config,  # noqa: F401
                     nearby_plan, nearby_units, plan_units, resolve_names, setting_label, unit_matches)
from . import report
from .result import RunResult
from .table import normalise

_EXECUTOR: ContextVar[Any] = ContextVar("rankcollapse_executor", default=None)


def default_cache_dir(out: Path) -> Path:
    """Cache shared by sibling run folders: ``<out>/../.rankcollapse-cache``."""
    return Path(out).resolve().parent / ".rankcollapse-cache"


def run_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A run's ``overrides``, checked to hold only the keys of :data:`OVERRIDE_KEYS` (else :class:`ConfigError`)
    and ``extra_models`` that load could find (:func:`~rankcollapse.models.source.check_model_source`; a dry run
    refuses a missing model folder as the run does)."""
    out = dict(overrides or {})
    unknown = sorted(set(out) - set(OVERRIDE_KEYS))
    if unknown:
        raise ConfigError(f"overrides: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"accepted keys: {', '.join(OVERRIDE_KEYS)}")
    for model in out.get("extra_models") or ():
        check_model_source(model)
    return out


#: Tokens per window N of a run that does not set ``n_tokens``.
DEFAULT_N_TOKENS = 128


def plan(name: str | None, scale: str, seed: int, *, text: str | Path | None = None, n_tokens: int | None = None,
         overrides: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[Unit], dict[str, Any]]:
    """Configs, de-duplicated units and the data spec of a run (validates everything;
    ``n_tokens`` None is :data:`DEFAULT_N_TOKENS`).

    Raises
    ------
    ConfigError, MaskError, DataError
        A bad seed or override, an unknown experiment or scale, an unreadable text file,
        or an option no unit of the run applies (:func:`check_applied`).
    """
    seed = check_int(seed, "seed", low=0)
    overrides = run_overrides(overrides)
    cfgs = [load_config(n) for n in resolve_names(name)]
    given_n = n_tokens
    n_tokens = DEFAULT_N_TOKENS if n_tokens is None else check_int(n_tokens, "n_tokens", low=2)
    data = data_spec(text, n_tokens, seed)
    seen: dict[str, str] = {}  # canonical spec -> as given: one mask twice would be planned (and computed) twice
    for spec in overrides.get("masks") or ():
        canonical = parse_mask(spec, n_tokens).spec
        if canonical in seen:
            raise ConfigError(f"gives the mask {canonical!r} twice ({seen[canonical]!r} and {spec!r}); give it once",
                              argument="overrides['masks']")
        seen[canonical] = spec
    for key in ("depth", "n_samples"):
        if overrides.get(key) is not None:
            check_int(overrides[key], f"overrides[{key!r}]", low=1)
    units = _expand(cfgs, scale, seed, data, overrides)
    check_applied(cfgs, units, text=text, n_tokens=given_n, overrides=overrides,
                  run=f"{', '.join(c['name'] for c in cfgs)} at scale {scale}")
    return cfgs, units, data


def _expand(cfgs: list[dict[str, Any]], scale: str, seed: int, data: dict[str, Any], overrides: dict[str, Any]
            ) -> list[Unit]:
    """The distinct units of ``cfgs``, their claims' sequence-length axes (:mod:`.axis`) included."""
    units: dict[str, Unit] = {}
    for cfg in cfgs:
        own = expand_units(cfg, scale, seed, data=data, overrides=overrides)
        for u in own + axis_units(cfg, own, scale):
            units.setdefault(u.hash, u)
    return list(units.values())


def check_applied(cfgs: list[dict[str, Any]], units: list[Unit], *, text: Any, n_tokens: int | None,
                  overrides: dict[str, Any], run: str) -> None:
    """Refuse an option that no unit of the run applies (it would be recorded and ignored): a :class:`ConfigError`
    naming the argument, the run and why it does not apply."""
    readers = [u for u in units if u.kind in MODEL_KINDS]
    specs = [s for c in cfgs for s in c["units"]]
    unused = []
    if text is not None and not readers:
        unused.append(("text", "no unit of it reads text"))
    if n_tokens is not None and not any("n_tokens" not in u.params for u in readers):
        unused.append(("n_tokens", "every unit sets its own N" if readers else "no unit of it reads text windows"))
    if overrides.get("masks") and not any(s["kind"] == "simulate" and "mask" in s.get("grid", {}) for s in specs):
        unused.append(("overrides['masks']", "it simulates no mask grid"))
    if overrides.get("depth") is not None and not any(u.kind == "simulate" for u in units):
        fixed = any(u.kind == "power_method" and u.params.get("network") == "simulator" for u in units)
        unused.append(("overrides['depth']", "its simulated networks have a fixed depth" if fixed
                       else "it simulates no network"))
    if overrides.get("n_samples") is not None and not readers:
        unused.append(("overrides['n_samples']", "no unit of it reads windows"))
    if overrides.get("extra_models") and not any(s["kind"] == "probe" and "model" in s.get("grid", {}) for s in specs):
        unused.append(("overrides['extra_models']", "it probes no list of models"))
    if unused:
        arg, why = unused[0]
        raise ConfigError(f"does not apply to {run}: {why}; drop it (it would be recorded and ignored)", argument=arg)


def compute_units(units: Iterable[Unit], ctx: RunContext, cache: Path | UnitCache, *,
                  progress: bool | UnitProgress = True, title: str = "units", executor: Any = None,
                  labels: Mapping[str, str] | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """``(table, timings)`` of every unit, computing only those missing from ``cache``
    (:func:`rankcollapse.sweep.run_units`): rows in the order of ``units``, one timing per
    unit. ``executor`` defaults to the run's (:func:`using_executor`), else serial;
    ``progress``: on stderr, or the run's :class:`~rankcollapse.sweep.UnitProgress`.
    """
    units = list(units)
    frames, timings = run_units(units, ctx, cache, executor=executor or _EXECUTOR.get(), progress=progress,
                                title=title, labels=labels or unit_labels(units), order=_share_key)
    parts = [f.assign(experiment=u.experiment) for f, u in zip(frames, units)]
    table = normalise(pd.concat(parts, ignore_index=True)) if parts else normalise(pd.DataFrame())
    return table, timings


@contextmanager
def using_executor(executor: Any) -> Iterator[Any]:
    """Make ``executor`` the default of :func:`compute_units` inside the block."""
    token = _EXECUTOR.set(executor)
    try:
        yield executor
    finally:
        _EXECUTOR.reset(token)


def _share_key(u: Unit) -> tuple:
    """Compute order: units that share inputs and weights run one after another (cache hits)."""
    p = u.params
    return (u.kind, str(p.get("model", "")), str(p.get("value", "")), str(p.get("init_scale", "")),
            int(p.get("seed", -1)), int(p.get("depth", 0)))


def evaluate_claims(cfgs: list[dict[str, Any]], table: pd.DataFrame, scale: str = "",
                    overrides: dict[str, Any] | None = None, n_tokens: int | None = None) -> list[dict[str, Any]]:
    """Claim records of every config on ``table``; a borrowed claim (``claims_from``)
    is listed only where the run's rows decide it. ``n_tokens``: the run's N (floors)."""
    out = {}
    excluded = tuple(m for c in cfgs for m in c["scales"].get(scale, {}).get("exclude_models", ()))
    own = {c["name"] for c in cfgs}
    for cfg in claim_sources(cfgs):
        depth = claim_depth(cfg, scale, overrides) if scale in cfg["scales"] else None
        for claim in claims_with_axes(cfg, scale):
            setting = claim.get("setting", "default")  # an axis claim reads its own rows
            res = claims_mod.evaluate_claim(table, claim, setting, depth=depth, n_tokens=n_tokens)
            if res["verdict"] == "not run" and cfg["name"] not in own and not (overrides or {}).get("masks"):
                continue  # borrowed claim this run has no rows for
            if claim["id"] in out:
                continue
            ctl = evaluate_controls(table, claim, depth=depth, setting=setting, n_tokens=n_tokens)
            rec = claims_mod.claim_record(claim, cfg["name"], res, excluded_models=excluded, scale=scale, controls=ctl)
            out[claim["id"]] = assess(rec, claim["rule"].get("expect", "all"))
    return sorted(out.values(), key=_claim_order)


def _claim_order(rec: dict[str, Any]) -> tuple:
    """Claims by id, each followed by its sequence-length axis in increasing N."""
    axis = rec.get("axis") or {}
    return (axis.get("claim", rec["id"]), int(axis.get("n_tokens", -1)), rec["id"])


def run_nearby(plan: list, records: list[dict[str, Any]], units: list[Unit], ctx: RunContext, cache: Path | UnitCache,
               *, progress: bool | UnitProgress, default: pd.DataFrame, labels: Mapping[str, str] | None = None
               ) -> tuple[pd.DataFrame | None, list[dict]]:
    """Run the nearby settings (:func:`nearby_plan`) of every claim the run decided, as one
    batch, and attach their verdicts to ``records``; rows a setting does not change come
    from ``default``. Returns the settings' rows (``claims``: the claims reading each unit)
    and timings."""
    by_id = {r["id"]: r for r in records}
    decided = [(c, settings) for c, settings in plan if c["id"] in by_id and by_id[c["id"]]["verdict"] != "not run"]
    todo = plan_units(decided)
    if not todo:
        return None, []
    table, timings = compute_units(todo, ctx, cache, progress=progress, title="nearby settings", labels=labels)
    frames: dict[str, pd.DataFrame] = {h: g for h, g in table.groupby("unit", sort=False)}
    users: dict[str, list[str]] = {}
    for claim, settings in decided:
        rec = by_id[claim["id"]]
        for label, override, nunits, reused in settings:
            for u in nunits:
                users.setdefault(u.hash, []).append(claim["id"])
            base = {u.hash for u in units if unit_matches(u, claim.get("nearby_units", {}))}
            keep = (~default["unit"].isin(base) | default["unit"].isin({u.hash for u in reused})) \
                & (default["setting"] == "default")  # a claim axis's rows belong to their own setting
            kept = default[keep].assign(setting=label)
            rows = pd.concat([frames[u.hash] for u in nunits] + [kept], ignore_index=True)
            res = claims_mod.evaluate_claim(rows, claim, setting=label, override=override, depth=rec["depth"],
                                            n_tokens=ctx.data["n_tokens"])
            rec["nearby"].append({"setting": label, "verdict": res["verdict"], "measured": res["measured"],
                                  "interval": res["interval"], "checks": res["checks"],
                                  **({"missing": res["missing"]} if "missing" in res else {})})
    table = pd.concat([g.assign(claims=",".join(dict.fromkeys(users[h]))) for h, g in frames.items()], ignore_index=True)
    return table, timings


@dataclass(frozen=True)
class StorageConfig:
    """Where a run keeps its numbers: the unit cache and the output folder's policy.

    Attributes
    ----------
    cache_dir : folder of the unit cache (default :func:`default_cache_dir`).
    recompute : recompute every unit and overwrite its cache entries.
    write : write the outputs into ``out`` (False: return the result only).
    wait : if another run holds ``out``, wait for it instead of failing.
    allow_nonempty : write into a non-empty ``out`` that no run wrote (its files stay).
    """

    cache_dir: str | Path | None = None
    recompute: bool = False
    write: bool = True
    wait: bool = False
    allow_nonempty: bool = False


@dataclass
class RunPlan:
    """Everything a run computes and decides, known before any unit runs (:func:`plan_run`)."""

    cfgs: list[dict[str, Any]]
    units: list[Unit]
    near_plan: list
    near_units: list[Unit]
    labels: dict[str, str]
    ctx: RunContext
    cache: UnitCache
    out: Path
    scale: str
    seed: int
    overrides: dict[str, Any]

    @property
    def title(self) -> str:
        return "/".join(c["name"] for c in self.cfgs)

    def config(self, shard: Shard | None = None) -> dict[str, Any]:
        """``config.json`` content (:func:`run_config`); a shard's names itself."""
        config = run_config(self.cfgs, self.scale, self.seed, self.ctx.data, self.overrides, self.units, self.labels)
        return config if shard is None else {**config, "shard": str(shard)}


def output_names(cfgs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The files a run of ``cfgs`` may write: :data:`OUTPUT_NAMES` and ``plots/<id>.png`` per plot."""
    return (*OUTPUT_NAMES, *sorted({f"plots/{spec['id']}.png" for c in cfgs for spec in c.get("plots", [])}))


def plan_run(name: str | None, scale: str, out: str | Path | None, seed: int, *, text: str | Path | None,
             n_tokens: int | None, overrides: dict[str, Any] | None, nearby: bool, execution: ExecutionConfig,
             storage: StorageConfig) -> RunPlan:
    """Validate every argument and plan the run before anything is written (the raises
    of :func:`run_experiment`)."""
    seed = check_int(seed, "seed", low=0)
    device = str(check_device(execution.device))
    overrides = run_overrides(overrides)
    cfgs, units, data = plan(name, scale, seed, text=text, n_tokens=n_tokens, overrides=overrides)
    out = Path(out) if out is not None else Path("runs") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    cache = UnitCache(Path(storage.cache_dir) if storage.cache_dir is not None else default_cache_dir(out),
                      recompute=storage.recompute)
    if execution.shard is not None:
        for arg in ("wait", "allow_nonempty"):
            if getattr(storage, arg):
                raise ConfigError(f"does not apply to shard {execution.shard}: a shard writes only into the unit "
                                  "cache, never into out", argument=arg)
    elif storage.write:  # a foreign folder, an untrusted manifest, a planted link, a user's report.md: refused here
        check_out(out, output_names(cfgs), allow_nonempty=storage.allow_nonempty)
    check_writable(cache.root, folder=True, option="cache_dir")
    if execution.executor == "ray" and execution.address is not None:
        check_ray_reachable(execution.address)  # before --out is locked: a refused run leaves nothing behind
    near_plan = nearby_plan(cfgs, units) if nearby else []
    near_units = plan_units(near_plan)
    return RunPlan(cfgs, units, near_plan, near_units, unit_labels(units + near_units), RunContext(data, device),
                   cache, out, scale, seed, overrides)


def run_experiment(name: str | None = "main", scale: str = "quick", out: str | Path | None = None, seed: int = 0, *,
                   text: str | Path | None = None, n_tokens: int | None = None,
                   overrides: dict[str, Any] | None = None, nearby: bool = True,
                   execution: ExecutionConfig | None = None, storage: StorageConfig | None = None) -> RunResult:
    """Run experiment ``name`` (``main``, ``fig2``, ``fig3``, ``fig4``, ``theory``, ``geometry``, ``influence``, ``laws``, ``power``, ``energy`` or ``all``).

    Plans every unit, computes those the cache lacks, decides the claims, runs their
    nearby settings and writes the outputs; with progress on, the cost estimate
    (:func:`estimate_run`) goes to stderr first.

    Parameters
    ----------
    scale : ``quick`` (minutes on 2 cores), ``paper`` (3000 windows) or ``smoke`` (tests).
    out : output folder (default ``runs/<UTC time>``); held exclusively while the run lives.
    seed : seeds the window order and (``seed + k``) the weights of seed ``k``.
    text : a UTF-8 text file (one document per line) or JSONL instead of Wikipedia.
    n_tokens : tokens per window N (default :data:`DEFAULT_N_TOKENS`); refused where no unit reads the run's windows at its N.
    overrides : ``masks`` (list of specs), ``depth``, ``n_samples`` (windows), ``extra_models``.
    nearby : run the pre-registered nearby settings of claims not reproduced.
    execution : where units run, the device, progress, and a shard
        (:class:`~rankcollapse.sweep.ExecutionConfig`; default serial on the CPU). A shard
        ``"I/K"`` computes its part of the units into the cache and decides and writes nothing.
    storage : the unit cache and the output folder's policy (:class:`StorageConfig`).

    Raises
    ------
    ConfigError, MaskError, DataError, AssetMissingError, ModelError
        Bad input (a negative seed, an unknown or absent device, an ``out`` or ``cache_dir`` that
        cannot be a folder, a non-empty ``out`` no run wrote, windows longer than a model's
        positions, an option no unit applies, ``wait`` or ``allow_nonempty`` with a shard),
        before any output or cache entry is created.
    OutputBusyError
        Another live run holds ``out`` (and ``storage.wait`` is false).

    See Also
    --------
    rankcollapse.experiments.evaluate_claim : how a claim's verdict follows from the table.
    rankcollapse.phase.run_phase : the phase diagram's sweep on the same engine.
    rankcollapse.dynamics.simulate : the simulated units.

    Examples
    --------
    A tiny run of Figure 4 (MiniLM's package must be installed; smoke scale, two
    16-token windows): the tidy table and the claim records.

    >>> import tempfile
    >>> from rankcollapse.sweep import ExecutionConfig
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     result = run_experiment("fig4", "smoke", out=f"{tmp}/run", n_tokens=16, overrides={"n_samples": 2},
    ...                             nearby=False, execution=ExecutionConfig(progress=False),
    ...                             storage=StorageConfig(cache_dir=f"{tmp}/cache", write=False))
    >>> sorted(result.table["source"].unique())
    ['pretrained_sa', 'probe']
    >>> [c["id"] for c in result.claims]
    ['C12']
    """
    t0, usage0 = time.perf_counter(), _cpu_seconds()
    execution = execution or ExecutionConfig()
    storage = storage or StorageConfig()
    rp = plan_run(name, scale, out, seed, text=text, n_tokens=n_tokens, overrides=overrides, nearby=nearby,
                  execution=execution, storage=storage)
    shard = execution.shard
    todo, cached, est = planned_cost(rp, execution)
    if execution.progress:  # the cost model's estimate, before anything is computed (docs/reproduce.md)
        sys.stderr.write("".join(f"estimate: {line}\n" for line in estimate_lines(est, est["workers"])))
    rp.cache.remove_orphans()  # temporary files of writers that died a day ago or more
    _preflight(rp.ctx, [u for u in todo if u.hash not in cached])
    with ExitStack() as stack:
        if storage.write and shard is None:
            # the previous run's outputs (and its marker) stay until this one is published
            stack.enter_context(OutputFolder(rp.out, output_names(rp.cfgs), wait=storage.wait,
                                             allow_nonempty=storage.allow_nonempty))
        ex = make_executor(execution.executor, workers=execution.workers, address=execution.address,
                           data=rp.ctx.data, device=str(rp.ctx.device))
        stack.callback(ex.close)
        stack.enter_context(using_executor(ex))
        title = rp.title if shard is None else f"{rp.title} shard {shard} of {len(rp.units) + len(rp.near_units)} units"
        bar = stack.enter_context(UnitProgress(title, len(todo), enabled=execution.progress))
        bar.expect(u for u in todo if u.hash not in cached)
        groups = [("default settings", len(rp.units)), ("nearby settings", len(rp.near_units))] if shard is None else None
        bar.start(len(cached), len(todo) - len(cached), getattr(ex, "workers", 1), ex.name, groups=groups)
        if shard is not None:
            table, timings = compute_units(todo, rp.ctx, rp.cache, progress=bar, labels=rp.labels)
            records, config = [], rp.config(shard)
        else:
            table, records, timings = _compute_and_decide(rp, bar, cached)
            config = rp.config()
        ex.close()  # worker processes end here, so their CPU time is counted below
        config["execution"] = {"executor": ex.name, "workers": getattr(ex, "workers", 1), "numerics": numerics_key(),
                               "cache": str(rp.cache.root)}
        seconds = time.perf_counter() - t0
        config["cost"] = {**run_cost(timings, seconds, _cpu_seconds() - usage0),
                          "estimated_cpu_seconds": round(est["total"]["cpu_seconds"], 1)}
        result = RunResult(rp.out, table, records, config, timings, seconds)
        if storage.write and shard is None:
            write_outputs(result)
    return result


def planned_cost(rp: RunPlan, execution: ExecutionConfig) -> tuple[list[Unit], set[str], dict[str, Any]]:
    """The units a run (or its shard) computes or reads, the keys of those cached, and
    :func:`.cost.estimate` of the rest (``workers`` None on a Ray cluster)."""
    units, n_tokens = rp.units + rp.near_units, rp.ctx.data["n_tokens"]
    todo = shard_units(execution.shard, units, n_tokens) if execution.shard is not None else units
    cached = {u.hash for u in todo if rp.cache.has(u)}
    workers = 1 if execution.executor == "serial" else execution.workers
    if workers is None and not (execution.executor == "ray" and execution.address is not None):
        workers = os.cpu_count() or 1  # the executor's default; a Ray cluster's CPUs are not known here
    return todo, cached, {**estimate(todo, n_tokens, cached, workers), "workers": workers}


def estimate_run(name: str | None = "main", scale: str = "quick", out: str | Path | None = None, seed: int = 0, *,
                 text: str | Path | None = None, n_tokens: int | None = None, overrides: dict[str, Any] | None = None,
                 nearby: bool = True, execution: ExecutionConfig | None = None,
                 storage: StorageConfig | None = None) -> dict[str, Any]:
    """:func:`.cost.estimate` of what :func:`run_experiment` with these arguments would
    compute (nearby settings in full), without computing, loading or writing anything.

    Raises
    ------
    ConfigError, MaskError, DataError
        Bad input, as :func:`run_experiment`; ``storage.wait`` or ``storage.allow_nonempty``.
    """
    execution = execution or ExecutionConfig()
    storage = storage or StorageConfig()
    for arg in ("wait", "allow_nonempty"):
        if getattr(storage, arg):
            raise ConfigError("does not apply to an estimate, which writes nothing", argument=arg)
    rp = plan_run(name, scale, out, seed, text=text, n_tokens=n_tokens, overrides=overrides, nearby=nearby,
                  execution=execution, storage=replace(storage, write=False))
    _, _, est = planned_cost(rp, execution)
    return {**est, "config_hash": rp.config()["config_hash"], "scale": scale,
            **({"shard": str(execution.shard)} if execution.shard is not None else {})}


def recorded_units(config: Mapping[str, Any]) -> tuple[list[tuple[Unit, float]], int]:
    """The units of a finished run planned again from its ``config.json`` content, each
    with its recorded ``compute_cpu_seconds`` (matched by key, else label; others left
    out), and the run's tokens per window."""
    cfgs = list(config["configs"])
    data = dict(config["data"])
    planned = _expand(cfgs, config["scale"], int(config["seed"]), data, dict(config.get("overrides") or {}))
    planned += plan_units(nearby_plan(cfgs, planned))
    labels = unit_labels(planned)
    by_key = {u.hash[:12]: u for u in planned}  # a timing names its unit by the key's first 12 digits
    by_label = {labels[u.hash]: u for u in planned}
    out = []
    for t in config["timings"]:
        u = by_key.get(str(t.get("hash", ""))[:12]) or by_label.get(t.get("unit"))
        if u is not None and t.get("compute_cpu_seconds") is not None:
            out.append((u, float(t["compute_cpu_seconds"])))
    return out, int(data.get("n_tokens") or DEFAULT_N_TOKENS)


def _compute_and_decide(rp: RunPlan, bar: UnitProgress, cached: set[str]
                        ) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """(table, claim records, timings) of the default units and the decided claims' nearby settings."""
    table, timings = compute_units(rp.units, rp.ctx, rp.cache, progress=bar, labels=rp.labels)
    records = evaluate_claims(rp.cfgs, table, rp.scale, rp.overrides, rp.ctx.data["n_tokens"])
    _drop_undecided(bar, rp.near_plan, rp.near_units, records, cached)
    if not rp.near_plan:
        return table, records, timings
    near, near_t = run_nearby(rp.near_plan, records, rp.units, rp.ctx, rp.cache, progress=bar, default=table,
                              labels=rp.labels)
    if near is not None:
        table = normalise(pd.concat([table, near], ignore_index=True))
    return table, records, timings + near_t


def _drop_undecided(bar: UnitProgress, near_plan: list, near_units: list[Unit], records: list[dict[str, Any]],
                    cached: set[str]) -> None:
    """Take the nearby units of undecided claims (which do not run) out of the progress total."""
    decided = {r["id"] for r in records if r["verdict"] != "not run"}
    keep = {u.hash for u in plan_units(near_plan, decided)}
    gone = [u for u in near_units if u.hash not in keep]
    if gone:
        undecided = sorted({c["id"] for c, _ in near_plan} - decided)
        bar.drop(len(gone), f"nearby settings of {', '.join(undecided)}, not decided",
                 cached=sum(u.hash in cached for u in gone), units=[u for u in gone if u.hash not in cached])


def _cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its ended child processes."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_cost(timings: list[dict[str, Any]], seconds: float, cpu_seconds: float) -> dict[str, Any]:
    """What this run spent (``wall_seconds``, ``cpu_seconds``: this process and its
    children) beside what its numbers cost (``unit_seconds``, ``unit_cpu_seconds``: summed
    over the units, by whichever run computed each; ``units_cost_unknown`` without a record)."""
    known = [t for t in timings if t.get("compute_seconds") is not None]
    return {"wall_seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2), "units": len(timings),
            "units_computed": sum(not t["cached"] for t in timings), "units_cached": sum(t["cached"] for t in timings),
            "unit_seconds": round(sum(t["compute_seconds"] for t in known), 2),
            "unit_cpu_seconds": round(sum(t["compute_cpu_seconds"] or 0.0 for t in known), 2),
            "units_cost_unknown": len(timings) - len(known)}


def _preflight(ctx: RunContext, units: list[Unit]) -> None:
    """Load every model the ``units`` need and cut their windows before anything is written."""
    need: dict[tuple[str, int, bool], int] = {}
    for u in units:
        if "n_samples" in u.params and u.params.get("model"):
            key = (u.params["model"], int(u.params.get("n_tokens") or ctx.data["n_tokens"]),
                   u.params.get("positions", "model") == "model")
            need[key] = max(need.get(key, 0), int(u.params["n_samples"]))
    try:
        for (model, n_tokens, positions), n in need.items():
            if positions:
                check_positions(ctx.model(model), n_tokens)
            ctx.windows(model, n, n_tokens=n_tokens)
    except DataError as exc:
        if ctx.data["corpus"] != "file":
            raise
        raise DataError(f"{ctx.data['path']}: {exc}") from None


def run_config(cfgs, scale, seed, data, overrides, units, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``config.json`` content: the body (experiments, scale, seed, data, overrides, configs),
    its hash, the units' labels and the versions."""
    labels = labels or unit_labels(units)
    body = {"experiments": [c["name"] for c in cfgs], "scale": scale, "seed": seed, "data": data,
            "overrides": overrides, "configs": cfgs}
    return {**body, "config_hash": config_hash(body), "units": {u.hash: labels[u.hash] for u in units}, "versions": versions()}


def write_outputs(result: RunResult) -> None:
    """Table (Parquet + CSV), plots, claims.json, config.json and reports, staged and
    published whole (:func:`rankcollapse._outdir.staged`); the caller holds the folder."""
    from . import plots

    with staged(result.out, f"config_hash {result.config['config_hash']}\n") as stage:
        with atomic_path(stage / "table.parquet") as tmp:
            result.table.to_parquet(tmp, index=False)
        with atomic_path(stage / "table.csv") as tmp:
            result.table.drop(columns=["values"], errors="ignore").to_csv(tmp, index=False)
        figures = plots.make_plots(result.table, result.config["configs"], stage / "plots")
        write_json_atomic(stage / "claims.json", result.claims)
        write_json_atomic(stage / "config.json", {**result.config, "timings": result.timings})
        write_text_atomic(stage / "report.html", report.render_html(result, figures))
        write_text_atomic(stage / "report.md", report.render_markdown(result, figures))


def _read_run(out: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], pd.DataFrame, dict[str, Any]]:
    """``(config, stored claims by id, table, rules)`` of the finished run in ``out`` (refusals: :func:`recheck`)."""
    claims, config, table = read_run(out, need_table=True)
    stored = {c["id"]: c for c in claims}
    rules = run_rules(config)
    unknown = sorted(set(stored) - set(rules))
    if unknown:
        raise ConfigError(f"{str(out / 'claims.json')!r} names claims its config.json does not define: "
                          f"{', '.join(unknown[:5])}")
    return config, stored, table, rules


def recheck(out: str | Path) -> list[tuple[str, str, str]]:
    """``[(id, stored, recomputed)]`` verdicts of a finished run, from its stored table and
    rules; a folder that is not a finished run raises :class:`ConfigError`."""
    config, stored, table, rules = _read_run(Path(out))
    return [(cid, stored[cid]["verdict"],
             claims_mod.evaluate_claim(table, rules[cid], rules[cid].get("setting", "default"),
                                       depth=stored[cid].get("depth"),
                                       n_tokens=(config.get("data") or {}).get("n_tokens"))["verdict"])
            for cid in sorted(stored)]


def decide_again(out: str | Path) -> list[dict[str, Any]]:
    """The claims.json records of the finished run in ``out`` decided again from its stored
    table and rules with today's decision layer (:func:`evaluate_claims`); nearby records
    kept as stored. Refusals as :func:`recheck`."""
    config, stored, table, rules = _read_run(Path(out))
    cfgs = [{**cfg, "claims": [rules.get(c["id"], c) for c in cfg.get("claims", [])]}
            for cfg in claim_sources(list(config["configs"]))]
    names = [c["name"] for c in cfgs]
    cfgs = [{**c, "claims_from": [n for n in c.get("claims_from", []) if n not in names]} for c in cfgs]
    records = evaluate_claims(cfgs, table, config["scale"], config.get("overrides"),
                              (config.get("data") or {}).get("n_tokens"))
    return [{**r, "nearby": stored[r["id"]].get("nearby", [])} for r in records if r["id"] in stored]
