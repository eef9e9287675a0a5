"""Cost model of a run's units (docs/reproduce.md, "The model"): a unit's CPU-seconds ``a + b * w``
estimated before anything runs, ``w`` its work (:func:`unit_work`) and ``a``, ``b`` the constants
of its cost class (:func:`unit_class`; a class without constants takes its kind's) in
:data:`CONSTANTS`, fitted by ``benchmarks/fit_cost_model.py`` to the committed runs' timings.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..metrics.registry import ATTENTION_METRICS
from ..models.sinks import SINK_METRICS
from ..sweep.progress import cost_class
from ..sweep.units import Shard, Unit
from .quantities import MODEL_WIDTHS
from .units import DEPTH_CHECK

#: Layers of the packaged models' networks (a pretrained attention-only unit without
#: ``depth`` runs them all).
MODEL_LAYERS = {"minilm": 6, "smollm2": 30}

#: ``{class: (a CPU-s per unit, b CPU-s per unit of work)}``, fitted by
#: ``benchmarks/fit_cost_model.py`` (module docstring); the kind alone is the fallback
#: of its classes.
CONSTANTS: dict[str, tuple[float, float]] = {
    'energy': (4.391, 0.001559),
    'energy[minilm]': (0.7135, 0.0004433),
    'energy[smollm2]': (8.069, 0.002674),
    'gap_count': (14.58, 0.008535),
    'gap_count[minilm]': (0, 0.008308),
    'gap_count[smollm2]': (0, 0.02216),
    'mask_influence': (0.04354, 1.025e-10),
    'model_influence': (0, 0.05726),
    'model_influence[smollm2]': (0, 0.05726),
    'phase_sink': (0.06281, 1.231e-09),
    'power_method': (5.799, 0),
    'power_method[minilm]': (0, 0.0009957),
    'power_method[simulator]': (0.08736, 1.131e-09),
    'pretrained_sa': (0, 3.483e-10),
    'pretrained_sa[minilm]': (0, 3.483e-10),
    'probe': (23.59, 0.002118),
    'probe[minilm]': (0.003763, 0.000435),
    'probe[minilm]+maps': (0, 0.0016),
    'probe[smollm2]': (0, 0.003841),
    'probe[smollm2]+maps': (0, 0.007708),
    'simulate': (0.1863, 1.233e-10),
    'simulate[minilm]': (0.1863, 1.233e-10),
    'temperature_law': (0.93, 4.865e-08),
    'temperature_switch': (1.533, 1.035e-07),
    'temperature_switch[exact]': (0.02243, 3.875e-11),
    'temperature_switch[simplex]': (2.288, 1.552e-07),
    'theory': (0.4144, 0),
    'theory[averaging_rate]': (0.032, 0),
    'theory[basin]': (1.879, 0),
    'theory[collapse_bound]': (0.3455, 0),
    'theory[energy_aligned]': (0.0335, 0),
    'theory[energy_rising]': (0.0395, 0),
    'theory[energy_spread]': (0.035, 0),
    'theory[energy_turning]': (0.0305, 0),
    'theory[equilibria]': (0.211, 0),
    'theory[equilibria_control]': (1.897, 0),
    'theory[equilibria_search]': (2.487, 0),
    'theory[ln_example_basin]': (0.1165, 0),
    'theory[ln_example_outside]': (0.1155, 0),
    'theory[massive_aligned]': (0.032, 0),
    'theory[massive_clipped]': (0.03767, 0),
    'theory[massive_null]': (0.042, 0),
    'theory[massive_spike]': (0.046, 0),
    'theory[sphere_collapse]': (0.4155, 0),
}


def unit_class(unit: Unit) -> str:
    """The cost class of ``unit``: :func:`~rankcollapse.sweep.progress.cost_class` (kind
    and model; ``+maps`` for a probe that reads attention maps, ``probe[smollm2]+maps``),
    else the kind with the network, theory check or token law that prices its work
    (``power_method[simulator]``, ``theory[basin]``)."""
    p = unit.params
    if p.get("model") is not None:  # a probe that reads attention maps runs the slower path that returns them
        maps = unit.kind == "probe" and any(m in ATTENTION_METRICS or m in SINK_METRICS for m in p.get("metrics") or ())
        return cost_class(unit) + ("+maps" if maps else "")
    for key in ("network", "check", "tokens"):
        if p.get(key) is not None:
            return f"{unit.kind}[{p[key]}]"
    return unit.kind


def _total(value: Any) -> float:
    """A parameter that is a number or a list of numbers, summed."""
    return float(sum(value)) if isinstance(value, (list, tuple)) else float(value)


def unit_work(unit: Unit, n_tokens: int) -> float:
    """The work of ``unit`` in its class's unit (module docstring); ``n_tokens``: the
    run's tokens per window, for units that do not set their own. 0 for a unit whose
    cost does not grow with a parameter (a theory check: its class's constant)."""
    p, kind = unit.params, unit.kind
    n = float(p.get("n_samples", 1))
    big_n = float(p.get("n_tokens") or n_tokens) if not isinstance(p.get("n_tokens"), list) else 0.0
    if kind in ("simulate", "pretrained_sa"):
        d = float(MODEL_WIDTHS.get(str(p.get("model")), 0))
        layers = float(p.get("depth") or MODEL_LAYERS.get(str(p.get("model")), 0))
        # windows beyond depth_check_windows K run the first half of the layers (units.run_simulate)
        k = min(float(p.get("depth_check_windows") or n), n)
        return (k * layers + (n - k) * (layers // DEPTH_CHECK)) * big_n * d * (big_n + d)
    if kind == "phase_sink" or (kind == "power_method" and p.get("network") == "simulator"):
        d, m = float(p["d_model"]), float(p["n_tokens"])
        return n * float(p["depth"]) * m * d * (m + d)
    if kind in ("probe", "energy", "gap_count", "power_method"):
        return n * big_n
    if kind == "model_influence":
        return n * big_n * float(p.get("n_probes") or 4)
    if kind == "mask_influence":
        return float(p["depth"]) * big_n ** 2
    if kind == "temperature_law":
        return float(p["n_queries"]) * _total(p["n_tokens"]) * float(p["d_model"])
    if kind == "temperature_switch":
        return n * len(p.get("grid") or [1]) * _total(p["n_tokens"]) * float(p.get("d_model", 64))
    return 0.0


def unit_cost(unit: Unit, n_tokens: int, constants: Mapping[str, tuple[float, float]] | None = None) -> float | None:
    """Estimated CPU-seconds of computing ``unit`` (None: neither its class nor its kind
    has constants)."""
    constants = CONSTANTS if constants is None else constants
    ab = constants.get(unit_class(unit)) or constants.get(unit.kind)
    if ab is None:
        return None
    return ab[0] + ab[1] * unit_work(unit, n_tokens)


def estimate(units: Iterable[Unit], n_tokens: int, cached: Iterable[str] = (), workers: int | None = 1
             ) -> dict[str, Any]:
    """The cost of computing ``units`` (the ones not in ``cached``, a set of unit hashes),
    per experiment and in all: ``{"experiments": {name: {units, cached, cpu_seconds,
    unknown}}, "total": {...  , longest_seconds, wall_seconds}}``. ``unknown`` counts the
    units to compute whose class has no constants (their cost is not in ``cpu_seconds``);
    ``wall_seconds`` is the total over ``workers`` cores (None: not known), at least the
    longest unit, if each worker gets a core."""
    cached = set(cached)
    per: dict[str, dict[str, Any]] = {}
    longest = 0.0
    unique: dict[str, Unit] = {}
    for u in units:
        unique.setdefault(u.hash, u)
    for u in unique.values():
        row = per.setdefault(u.experiment or "-", {"units": 0, "cached": 0, "cpu_seconds": 0.0, "unknown": 0})
        row["units"] += 1
        if u.hash in cached:
            row["cached"] += 1
            continue
        cost = unit_cost(u, n_tokens)
        if cost is None:
            row["unknown"] += 1
        else:
            row["cpu_seconds"] += cost
            longest = max(longest, cost)
    total = {k: sum(r[k] for r in per.values()) for k in ("units", "cached", "cpu_seconds", "unknown")}
    total["longest_seconds"] = longest
    total["wall_seconds"] = None if workers is None else max(total["cpu_seconds"] / max(int(workers), 1), longest)
    return {"experiments": per, "total": total}


def estimate_lines(est: Mapping[str, Any], workers: int | None = 1) -> list[str]:
    """``estimate``'s numbers as lines of text (one per experiment where there are
    several, then the total and its wall time on ``workers`` cores)."""
    def line(name: str, r: Mapping[str, Any]) -> str:
        todo = r["units"] - r["cached"]
        unknown = f" + {r['unknown']} of unknown cost" if r["unknown"] else ""
        return (f"{name}: {r['units']} units, {r['cached']} cached, {todo} to compute: "
                f"~{_round(r['cpu_seconds'])} CPU-s{unknown}")

    total = est["total"]
    out = [line(name, r) for name, r in est["experiments"].items()] if len(est["experiments"]) > 1 else []
    wall = "" if total["wall_seconds"] is None else \
        f"; ~{_round(total['wall_seconds'])} s wall on {workers} core{'s' if workers != 1 else ''}"
    out.append(line("total", total) + f"{wall} (longest unit ~{_round(total['longest_seconds'])} CPU-s)")
    return out


def _round(x: float) -> str:
    """Seconds as printed: whole seconds, thousands separated (one decimal under 10 s)."""
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def shard_units(shard: Shard, units: list[Unit], n_tokens: int) -> list[Unit]:
    """The units of ``shard``, balanced by estimated cost
    (:meth:`~rankcollapse.sweep.Shard.select` with :func:`unit_cost`; a unit of unknown
    cost counts as 1 CPU-s)."""
    def price(u: Unit) -> float:
        c = unit_cost(u, n_tokens)
        return 1.0 if c is None else c

    return shard.select(units, cost=price)

