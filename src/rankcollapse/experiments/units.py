"""The experiments' unit kinds: each function turns one :class:`~rankcollapse.sweep.Unit`
into tidy rows, and is registered with the sweep engine at the end of this module
(kind -> function, version; group ``experiments``, the kinds a config may name).

They only call the public APIs of the other areas (``masks.parse_mask``,
``dynamics.simulate``, ``dynamics.pretrained``, ``models.probe``/``embed``,
``theory``); nothing here re-implements a metric, a mask or a network.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from .._validate import Spec
from ..errors import ConfigError, RankCollapseError
from ..sweep.context import RunContext
from ..sweep.units import Unit, register_unit_kind
from .table import normalise, rows_from_metrics

#: Simulated networks run to this multiple of the claim depth D (:func:`.config.expand_units`),
#: so every verdict is also read at twice the depth from the same trajectories (weights are
#: drawn per layer from the seed, so the first D layers of a 2 D run are those of a D run).
DEPTH_CHECK = 2
DEFAULT_SIM_METRICS = ("mu", "mu_relative", "avg_abs_cos", "rank_fraction", "sigma_ratio")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def key_params(params: dict[str, Any]) -> dict[str, Any]:
    """A unit's parameters as its cache key hashes them: the run's ``data`` without its
    ``path`` (a text file counts by its content's ``sha256``, not by where it lies)."""
    if not isinstance(params.get("data"), dict):
        return params
    return {**params, "data": {k: v for k, v in params["data"].items() if k != "path"}}


def register(kind: str, run: Callable[[Unit, Any], pd.DataFrame], version: int) -> None:
    """Register an experiments unit kind (:func:`rankcollapse.sweep.register_unit_kind`): ``version`` is bumped when a
    change alters its units' labels or numbers; keys hash the parameters less a text file's path (:func:`key_params`)."""
    register_unit_kind(kind, run, version=version, group="experiments", key_params=key_params)


def _labels(unit: Unit, **extra: Any) -> dict[str, Any]:
    p = unit.params
    network = unit.kind in ("simulate", "pretrained_sa")
    out = {"experiment": unit.experiment, "source": unit.kind, "model": p.get("model", ""),
           "mask": Spec.name_of(p.get("mask", "")), "mask_spec": str(p.get("mask", "")),
           "variant": str(p.get("variant", "")), "value": str(p.get("value", "")), "d_qk": float(p.get("d_qk", np.nan)),
           "init_scale": float(p.get("init_scale", np.nan)), "seed": int(p.get("seed", -1)),
           "setting": p.get("setting", "default"), "unit": unit.hash, "norm": _norm_of(p),
           "sphere_radius": float(p.get("sphere_radius", 1.0)) if network else np.nan,
           # a pretrained network runs the model's own depth (-1) unless ``depth`` cuts it
           "depth": int(p.get("depth", -1)) if network else -1, "dtype": compute_dtype(unit)}
    return {**out, **extra}


def compute_dtype(unit: Unit) -> str:
    """Floating-point type of the computation behind a unit's numbers, whose epsilon is their floor (docs/reproduce.md,
    "Floors"): a simulated or attention-only network's ``dtype`` (float64 by default, whatever its input's storage
    type), float64 for theory checks and mask influence profiles, else a model's float32 forward."""
    if unit.kind in ("simulate", "pretrained_sa"):
        return str(unit.params.get("dtype", "float64"))
    return "float64" if unit.kind in ("theory", "mask_influence") else "float32"


def _norm_of(p: dict[str, Any]) -> str:
    """The norm a simulated block applies; empty for units without a variant preset (probes, theory)."""
    from ..dynamics.config import VARIANTS

    variant = str(p.get("variant", ""))
    if variant not in VARIANTS:
        return ""
    return str(p.get("norm") or VARIANTS[variant].norm)


def _simulate_chunks(unit: Unit, ctx: RunContext, x0_fn: Callable[[int, int], torch.Tensor], n: int,
                     depth: int, kw_fn: Callable[[int], dict[str, Any]], *, start: int = 0) -> dict[str, torch.Tensor]:
    """Per-window metrics of ``simulate`` over windows ``start..n-1`` with the keywords ``kw_fn(d)``, in
    chunks at the multiples of the unit's ``chunk`` (a window runs in the batch it has from ``start`` = 0)."""
    from ..dynamics import RunConfig, simulate

    p = unit.params
    chunk = int(p.get("chunk", 64))
    run = RunConfig(depth=depth, seed=max(int(p.get("seed", 0)), 0),  # -1 = no random weights (pretrained_sa)
                    dtype=_DTYPES[p.get("dtype", "float64")], device=ctx.device, backend=str(p.get("backend") or "auto"))
    edges = [start, *range(start - start % chunk + chunk, n, chunk), n]
    parts: list[dict[str, torch.Tensor]] = []
    for a, b in zip(edges[:-1], edges[1:]):
        X0 = x0_fn(a, b)
        # the spec as written: simulate asks once whether it is a schedule (schedule:A*k,B)
        res = simulate(X0, str(p["mask"]), run=run, metrics=list(p.get("metrics", DEFAULT_SIM_METRICS)),
                       **kw_fn(X0.shape[-1]))
        parts.append({k: v.detach().cpu() for k, v in res.metrics.items()})
    return {k: torch.cat([pt[k] for pt in parts], dim=1) for k in parts[0]}


def run_simulate(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """Random-init network on X(0) = ``model``'s embeddings (spec.md §2, §5.4), run to
    ``depth`` = 2 D layers. With ``depth_check_windows`` K < ``n_samples``, windows
    0..K-1 run to 2 D and the others to D with the same first D layers: rows at layers
    0..D hold every window, rows at layers D+1..2 D the first K (``n_samples`` K)."""
    p = unit.params
    n, depth = int(p["n_samples"]), int(p["depth"])
    k = min(int(p.get("depth_check_windows") or n), n)
    block = _block(p)
    x0 = lambda a, b: ctx.embeddings(p["model"], n, start=a, stop=b)  # noqa: E731
    kw = lambda d: {"block": block, **_shared_weights(p, d, block, ctx)}  # noqa: E731
    deep = _simulate_chunks(unit, ctx, x0, k, depth, kw)
    if k == n:
        return rows_from_metrics(deep, _labels(unit))
    claim = depth // DEPTH_CHECK

    def first_layers(d: int) -> dict[str, Any]:  # the first D of the 2 D layers drawn from the seed
        out = kw(d)
        return {**out, "weights": out["weights"][:claim]}

    rest = _simulate_chunks(unit, ctx, x0, n, claim, first_layers, start=k)
    labels = _labels(unit)
    return pd.concat([
        rows_from_metrics({m: torch.cat([v[: claim + 1], rest[m]], dim=1) for m, v in deep.items()}, labels),
        rows_from_metrics({m: v[claim + 1:] for m, v in deep.items()}, labels,
                          layers=list(range(claim + 1, depth + 1))),
    ], ignore_index=True)


def _shared_weights(p: dict[str, Any], d: int, block: Any, ctx: RunContext) -> dict[str, Any]:
    """``simulate``'s ``d_qk`` and the weights it would draw, drawn once per run context: ``W_Q, W_K ~
    N(0, (s R)^2/d)`` (``init_scale`` s, ``sphere_radius`` R: logits times R^2, ../shared/docs/theory.md §2)."""
    from ..dynamics.config import resolve_variant

    d_qk, s = float(p.get("d_qk", 1.0)), float(p.get("init_scale", 1.0)) * float(p.get("sphere_radius", 1.0))
    cfg = resolve_variant(block)
    weights = ctx.random_weights(d, int(p["depth"]), seed=int(p.get("seed", 0)), value=p.get("value") or "gaussian",
                                 query_key=f"gaussian:std={s / d ** 0.5!r}" if s != 1.0 else "gaussian",
                                 n_heads=cfg.n_heads, out_proj=cfg.out_proj,
                                 mlp_ratio=cfg.mlp_ratio if cfg.mlp else None)
    return {"d_qk": d_qk, "weights": weights}


def _block(p: dict[str, Any]) -> Any:
    """The unit's preset name (``variant``), or a BlockConfig when a nearby setting changes the norm type."""
    if not p.get("norm"):
        return p["variant"]
    from ..dynamics.config import resolve_variant

    return resolve_variant(p["variant"], norm=p["norm"])


#: Inputs X(0) of an attention-only network: the model's embedding output (``model``) or
#: the same without its position embeddings (``none``: ``models.content``).
POSITIONS = ("model", "none")


def run_pretrained_sa(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """Attention-only network with a pretrained model's attention weights (``dynamics.pretrained``), scores divided by
    ``sqrt(d_qk)``; optionally ``n_tokens`` (window length), ``positions`` (:data:`POSITIONS`; ``none`` lets N exceed
    the position table), ``depth`` (the first layers only) and ``backend`` (``simulate``'s attention kernel)."""
    from ..dynamics.pretrained import extract_attention_weights

    p = unit.params
    n = int(p["n_samples"])
    loaded = ctx.model(p["model"])
    # scale=None: the logits become q.k / sqrt(d_qk), replacing the model's 1/sqrt(d_head)
    weights = [dataclasses.replace(lw, scale=None) for lw in extract_attention_weights(loaded.model)]
    depth, n_tokens, positions = p.get("depth"), p.get("n_tokens"), str(p.get("positions", "model"))
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= len(weights)):
        raise ConfigError(f"pretrained_sa depth must be an integer in 1..{len(weights)} (the model's layers), "
                          f"got {depth!r}")
    if positions not in POSITIONS:
        raise ConfigError(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
    weights = weights[:depth]  # depth None: every layer
    metrics = _simulate_chunks(
        unit, ctx, lambda a, b: ctx.embeddings(p["model"], n, start=a, stop=b, n_tokens=n_tokens,
                                               positions=positions == "model"), n, len(weights),
        lambda d: {"block": _block(p), "weights": weights, "d_qk": float(p["d_qk"])},
    )
    return rows_from_metrics(metrics, _labels(unit, value="pretrained"))


def run_probe(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """Per-layer metrics of a real pretrained model (``models.probe``)."""
    p = unit.params
    drop = tuple(p.get("drop", ()))
    loaded, win, labels = _model_unit(unit, ctx, drop)
    try:
        df = _probe_per_window(loaded, win, list(p.get("metrics", DEFAULT_SIM_METRICS)), int(p.get("batch_size", 8)),
                               drop, bool(p.get("clip_massive", False)))
    except RankCollapseError as exc:
        if not drop:
            raise
        # removing components can overflow float32 activations: the model without them has
        # no measurement (no rows, so a claim on it reads "missing"), and the run says why
        warnings.warn(f"{unit.label}: no rows, the probe failed without {', '.join(drop)}: {str(exc)[:200]}",
                      RuntimeWarning, stacklevel=2)
        df = pd.DataFrame({"layer": pd.Series([], dtype=np.int64), "point": pd.Series([], dtype=str),
                           "metric": pd.Series([], dtype=str)})
    return normalise(df, labels)


def _model_unit(unit: Unit, ctx: RunContext, drop: tuple = ()) -> tuple[Any, Any, dict[str, Any]]:
    """``(model, windows, labels)`` of a unit that reads ``model``'s windows: the model of :func:`_probe_condition`,
    labelled with its native mask, ``variant``, ``value`` and ``family``."""
    from ..models.families import native_mask_of

    p = unit.params
    loaded = ctx.model(p["model"])
    win = ctx.windows(p["model"], int(p["n_samples"]))
    variant, value, loaded = _probe_condition(p, loaded, drop)
    native = native_mask_of(loaded)
    return loaded, win, _labels(unit, mask=native, mask_spec=native, variant=variant, value=value, family=loaded.family)


def _probe_condition(p: dict[str, Any], loaded: Any, drop: tuple) -> tuple[str, str, Any]:
    """``(variant, value, model)``: ``full``/``drop_<components>`` (+ ``_clip_massive``); ``pretrained``, or
    ``random_init`` with ``control: random-init`` (:func:`rankcollapse.models.controls.random_init`, ``control_seed``)."""
    variant = ("full" if not drop else "drop_" + "_".join(drop)) + ("_clip_massive" if p.get("clip_massive") else "")
    control = p.get("control")
    if control is None:
        return variant, "pretrained", loaded
    from ..models.controls import CONTROLS, random_init

    if control not in CONTROLS:
        raise ConfigError(f"unknown probe control {control!r}; choose from {', '.join(CONTROLS)}")
    return variant, control.replace("-", "_"), random_init(loaded, seed=int(p.get("control_seed", 0)))


def _probe_per_window(loaded: Any, win: Any, metrics: list[str], batch_size: int, drop: tuple = (),
                      clip_massive: bool = False) -> pd.DataFrame:
    """``models.probe``'s per-window rows, without the per-head ones; no progress bar of its own."""
    from ..models.probe import Intervention, probe

    df = probe(loaded, win, Intervention(drop=drop, clip_massive=clip_massive), metrics=metrics, batch_size=batch_size,
               per_window=True, progress=False)
    return df[~df["point"].str.contains(".head_", regex=False)].reset_index(drop=True)


def run_theory(unit: Unit, ctx: RunContext) -> pd.DataFrame:
    """Numerical checks of spec.md §5 (``rankcollapse.theory``)."""
    from . import theory_units

    check = unit.params["check"]
    fn = getattr(theory_units, f"rows_{check}", None)
    if fn is None:
        raise ConfigError(f"unknown theory check {check!r}")
    labels = {k: v for k, v in _labels(unit, model="theory", variant=check).items() if k not in ("mask", "mask_spec")}
    return normalise(fn(unit.params, ctx), labels)


register("simulate", run_simulate, 3)
register("probe", run_probe, 4)
register("pretrained_sa", run_pretrained_sa, 3)
register("theory", run_theory, 4)
