"""Declarative experiment configs (``configs/<name>.yaml``): loading, validation,
expansion into units of work (a run's and its nearby settings'), and hashes.

A config names its inputs, its scales (``smoke``, ``quick``, ``large`` = 256 windows x
4 seeds, ``paper``), its units
(each a ``kind`` with a ``grid`` of values whose Cartesian product gives one unit per
combination and seed), its plots and its pre-registered claims. A unit
(:class:`rankcollapse.sweep.Unit`) holds everything that determines its numbers; its
hash keys the cache. The unit kinds a config may name are those registered with
group ``experiments`` (:mod:`.units`).
"""

from __future__ import annotations

import itertools
from importlib import resources
from typing import Any

import yaml

from .._validate import Spec
from ..errors import ConfigError
from ..sweep.units import Unit
from .schema import validate_config
from .units import DEPTH_CHECK, _norm_of

EXPERIMENTS = ("main", "fig2", "fig3", "fig4", "theory", "geometry", "influence", "laws", "power", "energy", "sinks")
ALIASES = {"": "main", "all": "all"}
SCALES = ("quick", "large", "paper", "smoke")
#: Windows a simulate unit runs beyond the claim depth: a unit with more windows runs
#: layers D+1..2 D on its first ``DEPTH_CHECK_WINDOWS`` windows only (the first windows of
#: the run's list, the same for every unit and seed), the others to D (docs/reproduce.md, "Depth").
DEPTH_CHECK_WINDOWS = 256
#: Windows of a control unit at any scale (docs/reproduce.md, "Controls").
CONTROL_WINDOWS = 16
#: PyYAML's safe loader, with libyaml's parser where PyYAML has it (the same documents, parsed ~8x faster).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_config(name: str) -> dict[str, Any]:
    """The parsed YAML config of experiment ``name`` (one of :data:`EXPERIMENTS`).

    Raises
    ------
    ConfigError
        Unknown experiment or a config that fails validation (names the key).
    """
    if name not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)} or 'all'")
    text = resources.files(__package__).joinpath("configs", f"{name}.yaml").read_text(encoding="utf-8")
    cfg = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a SafeLoader
    validate_config(cfg, name)  # the pydantic schema: an unknown, misspelt or missing key is an error naming it
    validate(cfg, name)
    return cfg


def resolve_names(name: str | None) -> list[str]:
    """``None``/``''``/``main`` -> ``['main']``; ``all`` -> every experiment; a
    comma-separated list (``fig3,fig4``) -> those experiments, in that order.

    Raises ConfigError naming an unknown experiment."""
    name = ALIASES.get(name or "", name)
    if name == "all":
        return list(EXPERIMENTS)
    names = [ALIASES.get(n.strip(), n.strip()) for n in str(name).split(",")]
    bad = [n for n in names if n not in EXPERIMENTS]
    if bad:
        raise ConfigError(f"unknown experiment {bad[0]!r}; choose one of {', '.join(EXPERIMENTS)}, 'all' "
                          "or a comma-separated list")
    return list(dict.fromkeys(names))


def validate(cfg: dict[str, Any], name: str) -> None:
    """The checks beyond the schema (:func:`~.schema.validate_config`): scales ``quick`` and ``paper``, distinct claim ids."""
    missing = [s for s in ("quick", "paper") if s not in cfg["scales"]]
    if missing:
        raise ConfigError(f"config {name}: scales {missing} missing")
    ids = [c["id"] for c in cfg.get("claims", [])]
    if len(ids) != len(set(ids)):
        raise ConfigError(f"config {name}: duplicate claim ids {ids}")


def scale_settings(cfg: dict[str, Any], scale: str) -> dict[str, Any]:
    """The settings of ``scale`` (validated name)."""
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {', '.join(SCALES)}")
    if scale not in cfg["scales"]:
        raise ConfigError(f"experiment {cfg['name']} has no scale {scale!r}")
    return dict(cfg["scales"][scale])


#: The keys a run's ``overrides`` may hold (any other is refused by ``runner.run_overrides``).
OVERRIDE_KEYS = ("masks", "depth", "n_samples", "extra_models")


#: Unit kinds that draw random weights: one unit per weight seed ``seed + k``, k < ``n_seeds``.
SEEDED_KINDS = ("simulate", "phase_sink")
#: Unit kinds that read a pretrained model (weights, config, tokenizer) and the run's text windows (and ``n_tokens``
#: unless the unit sets its own).
MODEL_KINDS = ("simulate", "pretrained_sa", "probe", "model_influence", "power_method", "energy", "gap_count")


def expand_units(cfg: dict[str, Any], scale: str, seed: int, *, data: dict[str, Any],
                 overrides: dict[str, Any] | None = None) -> list[Unit]:
    """All units of ``cfg`` at ``scale``, each holding ``data`` (the run's input description), the digests of the
    files its model and mask read (:func:`rankcollapse.models.loading.model_key`, :func:`mask_key`) and the
    run's ``overrides`` (:data:`OVERRIDE_KEYS`), all part of its hash."""
    sc = scale_settings(cfg, scale)
    overrides = overrides or {}
    units = []
    for spec in cfg["units"]:
        grid = {k: list(v) if isinstance(v, list) else [v] for k, v in spec.get("grid", {}).items()}
        if overrides.get("masks") and "mask" in grid and spec["kind"] == "simulate":
            grid["mask"] = list(overrides["masks"])
        if overrides.get("extra_models") and "model" in grid and spec["kind"] == "probe":
            grid["model"] = grid["model"] + [m for m in overrides["extra_models"] if m not in grid["model"]]
        for combo in itertools.product(*grid.values()):
            params = dict(spec.get("params", {}))
            params.update(zip(grid.keys(), combo))
            params["data"] = data
            params["setting"] = "default"
            params.update(_scale_params(spec, sc, params, overrides))
            if params.get("model") in sc.get("exclude_models", ()):
                continue
            if spec["kind"] in MODEL_KINDS and params.get("model"):
                from ..models.loading import model_key

                params.update(model_key(params["model"]))
            params.update(mask_key(params.get("mask")))
            seeds = [seed + k for k in range(int(sc.get("n_seeds", 1)))] if spec["kind"] in SEEDED_KINDS else [-1]
            for s in seeds:
                units.append(Unit(spec["kind"], {**params, "seed": s}, cfg["name"]))
    return units


def mask_key(spec: Any) -> dict[str, Any]:
    """``{"mask_sha256": [digest, ...]}`` of the files the mask or schedule ``spec`` reads
    (:func:`rankcollapse.masks.schedule.mask_digests`), so that a mask file rewritten in
    place gives new keys; ``{}`` for a mask that reads no file."""
    from ..masks.schedule import mask_digests

    digests = mask_digests(spec)
    return {"mask_sha256": digests} if digests else {}


def _scale_params(spec: dict, sc: dict, params: dict, overrides: dict) -> dict[str, Any]:
    kind = spec["kind"]
    out: dict[str, Any] = {}
    if kind in MODEL_KINDS:
        per_model = sc.get("n_samples_per_model", {})
        n = int(overrides.get("n_samples") or per_model.get(params.get("model", ""), sc.get("n_samples", 16)))
        # a control unit (role: control) shows an effect that is certainly there or certainly
        # absent: a few windows do, at every scale
        out["n_samples"] = min(n, CONTROL_WINDOWS) if params.get("role") == "control" else n
    if kind == "simulate":
        out["depth"] = DEPTH_CHECK * int(overrides.get("depth") or params.get("depth") or sc["depth"])
        if out["n_samples"] > DEPTH_CHECK_WINDOWS:  # a unit with fewer windows keeps its key
            out["depth_check_windows"] = DEPTH_CHECK_WINDOWS
    if kind == "phase_sink":
        out["n_samples"] = int(sc["n_samples"])
    if kind == "theory":
        out["budget"] = sc.get("theory_budget", {})
    if kind == "temperature_law":
        out["n_queries"] = int(sc.get("n_queries", 64))
    if kind == "power_method" and params.get("network", "simulator") == "simulator":
        out["depth"] = int(sc["depth"])  # a fixed-depth reading: the claims read its last layer
    if kind == "temperature_switch":  # the short sequences only where the scale caps them
        out["n_samples"] = int(sc.get("n_samples", 4))
        cap = sc.get("max_axis_tokens")
        out["n_tokens"] = [n for n in params["n_tokens"] if cap is None or int(n) <= int(cap)]
    return out


def claim_depth(cfg: dict[str, Any], scale: str, overrides: dict[str, Any] | None = None) -> int | None:
    """The depth D at which ``cfg``'s claims read simulated networks (``layer: last``);
    None for a config without simulated units. Units run to ``DEPTH_CHECK * D``."""
    if not any(u["kind"] == "simulate" for u in cfg["units"]):
        return None
    sc = scale_settings(cfg, scale)
    return int((overrides or {}).get("depth") or sc["depth"])


def effective_override(unit: Unit, override: dict[str, Any]) -> dict[str, Any]:
    """The part of ``override`` that changes ``unit``'s numbers: ``window`` only for windowed masks, ``norm`` only for
    variants that have a norm (``norm=layernorm`` must not turn pure SA into SA-LN), any other key where it differs."""
    from ..dynamics.config import resolve_variant

    params, out = unit.params, {}
    for k, v in override.items():
        if k == "window":
            if Spec.name_of(params.get("mask", "")) in WINDOWED:
                out[k] = v
        elif k == "norm":
            norm = resolve_variant(str(params["variant"])).norm if params.get("variant") is not None else "none"
            if norm not in ("none", v):
                out[k] = v
        elif params.get(k) != v:
            out[k] = v
    return out


#: the masks whose width a ``window`` override sets
WINDOWED = ("sliding_window", "causal_sliding_window")


def window_spec(spec: Any, override: dict[str, Any]) -> Any:
    """``spec`` with the width ``override["window"]`` if it is a window mask
    (``sliding_window:w=9`` -> ``sliding_window:w=W``), else ``spec`` as it is."""
    name = Spec.name_of(spec)
    return str(Spec(name, {"w": override["window"]})) if "window" in override and name in WINDOWED else spec


def with_override(unit: Unit, override: dict[str, Any], label: str) -> Unit:
    """A copy of ``unit`` for a nearby-setting run: ``window`` sets the mask spec's width, any other key replaces its
    parameter (pass only the :func:`effective_override`)."""
    params = dict(unit.params)
    for k, v in override.items():
        if k == "window":
            params["mask"] = window_spec(params["mask"], override)
        else:
            params[k] = v
    params["setting"] = label
    return Unit(unit.kind, params, unit.experiment)


def setting_label(override: dict[str, Any]) -> str:
    """Stable, readable label of an override, e.g. ``init_scale=2,value=orthogonal``."""
    return ",".join(f"{k}={override[k]}" for k in sorted(override))


def claim_sources(cfgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configs whose claims a run evaluates: its own plus their ``claims_from``."""
    names = [c["name"] for c in cfgs]
    extra = [n for c in cfgs for n in c.get("claims_from", []) if n not in names]
    return list(cfgs) + [load_config(n) for n in dict.fromkeys(extra)]


def unit_matches(u: Unit, filt: dict[str, Any]) -> bool:
    """Whether unit ``u`` passes the filter ``filt`` (a claim's ``nearby_units``, an
    axis's ``units``): ``{param: value or list of values}``, where ``kind`` is the unit's
    kind, ``mask`` the mask family, ``norm`` the block's norm and ``sphere_radius``
    defaults to 1; values compare as strings."""
    for k, want in filt.items():
        wants = [str(w) for w in (want if isinstance(want, list) else [want])]
        have = (u.kind if k == "kind" else Spec.name_of(u.params.get("mask", "")) if k == "mask"
                else _norm_of(u.params) if k == "norm" else float(u.params.get("sphere_radius", 1.0)) if k == "sphere_radius"
                else u.params.get(k, ""))
        if str(have) not in wants:
            return False
    return True


#: Metrics recorded by nearby-setting runs: the ones the claim rules read.
NEARBY_METRICS = ("mu", "mu_relative")


def nearby_units(cfg: dict[str, Any], claim: dict[str, Any], units: list[Unit]
                 ) -> list[tuple[str, dict, list[Unit], list[Unit]]]:
    """Per nearby setting of ``claim``: (label, override, units to run, units reused unchanged)."""
    filt = claim.get("nearby_units", {})
    # nearby settings are a first look: one weight seed (the run's first)
    first = min((int(u.params.get("seed", -1)) for u in units if u.kind == "simulate"), default=-1)
    # control units (params role: control) serve the controls only, not nearby settings
    base = [u for u in units if u.params.get("setting") == "default" and unit_matches(u, filt)
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
                eff = {**eff, "metrics": list(NEARBY_METRICS)}
            changed.append(with_override(u, eff, label))
        out.append((label, override, changed, reused))
    return out


def nearby_plan(cfgs: list[dict[str, Any]], units: list[Unit]
                ) -> list[tuple[dict[str, Any], list[tuple[str, dict, list[Unit], list[Unit]]]]]:
    """``[(claim, nearby_units(...))]`` of every claim of the run with nearby settings."""
    out = []
    for cfg in claim_sources(cfgs):
        for claim in cfg.get("claims", []):
            settings = [s for s in nearby_units(cfg, claim, units) if s[2]]
            if settings:
                out.append((claim, settings))
    return out


def plan_units(plan: list[tuple[dict[str, Any], list]], ids: set[str] | None = None) -> list[Unit]:
    """The distinct units of the nearby ``plan`` (of the claims ``ids``; all by default), in order."""
    out: dict[str, Unit] = {}
    for claim, settings in plan:
        if ids is None or claim["id"] in ids:
            for _, _, nunits, _ in settings:
                out.update({u.hash: u for u in nunits if u.hash not in out})
    return list(out.values())
