"""Threshold bands: each threshold of a claim rule read across a pre-registered range.

A verdict that changes when a threshold moves inside the range where it could as well
have been set is a finding about the threshold, not about the effect. Every threshold of
a rule therefore carries a *band*, fixed before the numbers are seen:

- a stated range ``band: [lo, hi]`` in the check's config (in the units of the threshold
  τ the check compares with: ``factor`` times the constant of a constant right-hand side);
- by default ×½ to ×2 of the threshold's distance from its no-effect value: 1 for a
  fitted per-layer rate against a constant (``rate >= 1 - δ`` has the band ``1 - 2δ`` to
  ``1 - δ/2``) and for ``within`` a factor (``within 1.25``: 1.125 to 1.5), 0 otherwise (a ratio ``>= 10`` has the band 5 to 20, a difference
  ``> 0.01`` the band 0.005 to 0.02; a rank correlation's band is cut to [-1, 1]). A threshold at the no-effect value itself (a
  difference against 0, a ratio against 1) has no band: moving it changes the question.

A threshold is shared by the copies a ``for_each`` makes of one check (they move
together) and is varied with every other threshold of the rule at its registered value.
Each check's outcome is a step function of τ whose steps are the ends of its 95 %
interval (and of its factor-off arm's, :mod:`.claims`), so the verdict across the band
is exact: it is read on a grid of :data:`GRID` log-spaced values and in every segment
between those interval ends, and a *flip point* is an interval end where it changes.
A verdict that changes inside the band reads ``threshold-sensitive`` (the verdict at the
registered threshold is kept beside it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Points of the log-spaced grid across each band (both ends included).
GRID = 13


def group_of(record: dict[str, Any]) -> str:
    """The threshold a check record reads: its check name without the ``[key=value]``
    suffix a ``for_each`` copy carries (the copies share one threshold)."""
    name = str(record.get("check") or record.get("text", ""))
    if name.endswith("]") and " [" in name:
        name = name.rsplit(" [", 1)[0]
    return name


def reference(spec: dict[str, Any]) -> float:
    """The no-effect value a check's threshold is measured from (module docstring)."""
    rhs = spec.get("rhs", {"const": 1.0})
    if spec.get("op") == "within":  # within a factor tau either way: tau = 1 is exact agreement
        return 1.0
    return 1.0 if spec.get("lhs", {}).get("stat") == "rate" and "const" in rhs else 0.0


def band_of(spec: dict[str, Any], tau: float) -> list[float] | None:
    """The band ``[lo, hi]`` of threshold ``tau`` of check ``spec`` (module docstring);
    None where the threshold is the no-effect value."""
    if spec.get("band") is not None:
        lo, hi = (float(x) for x in spec["band"])
        return [min(lo, hi), max(lo, hi)]
    ref = reference(spec)
    if not math.isfinite(tau) or tau == ref or (spec.get("compare", "ratio") == "ratio"
                                                and "const" not in spec.get("rhs", {"const": 1.0}) and tau == 1.0):
        return None
    ends = sorted((ref + (tau - ref) / 2, ref + (tau - ref) * 2))
    if spec.get("lhs", {}).get("stat") in ("spearman", "profile_spearman"):  # a rank correlation is in [-1, 1]
        ends = [max(ends[0], -1.0), min(ends[1], 1.0)]
    return [float(ends[0]), float(ends[1])]


def grid(band: list[float], tau: float, ref: float | None) -> list[float]:
    """:data:`GRID` values across ``band``, log-spaced in the distance from ``ref`` (or
    in τ itself for a stated band that does not straddle 0; linear otherwise)."""
    lo, hi = band
    if ref is not None and (lo - ref) * (hi - ref) > 0:
        a, b = abs(lo - ref), abs(hi - ref)
        sign = 1.0 if lo > ref else -1.0
        return sorted(float(ref + sign * v) for v in np.geomspace(a, b, GRID))
    if lo > 0 or hi < 0:
        return [float(v) for v in np.geomspace(lo, hi, GRID)]
    return [float(v) for v in np.linspace(lo, hi, GRID)]


def _edges(records: list[dict[str, Any]]) -> list[float]:
    """Every τ at which an outcome of ``records`` can change: the ends of each check's
    interval and of its factor-off arm's (and their reciprocals under ``within``)."""
    out = []
    for r in records:
        ivs = [r.get("interval")] + [(r.get("factor_off") or {}).get("interval")]
        for iv in ivs:
            for x in iv or ():
                if x is not None and math.isfinite(x):
                    out.append(float(x))
                    if r.get("op") == "within" and x:
                        out.append(1.0 / float(x))
    return out


def verdict_at(scored: list[dict[str, Any]], expect: str, group: str, tau: float) -> str:
    """The verdict of the rule with threshold ``group`` moved to ``tau``."""
    from .claims import outcome_at, verdict_from

    return verdict_from([outcome_at(r, tau if group_of(r) == group else r["threshold"]) for r in scored], expect)


def threshold_bands(scored: list[dict[str, Any]], expect: str = "all") -> list[dict[str, Any]]:
    """One entry per threshold of the scored check records (each annotated with its
    ``band`` and ``reference``, :func:`annotate`): the band, the verdict at the registered
    threshold and at each end, the verdicts on the grid, the flip points inside the band
    and the one nearest the registered threshold, and ``sensitive``."""
    out = []
    for group in dict.fromkeys(group_of(r) for r in scored):
        members = [r for r in scored if group_of(r) == group]
        first = members[0]
        tau, band = float(first["threshold"]), first.get("band")
        entry: dict[str, Any] = {"threshold": group, "registered": tau, "op": first.get("op"), "band": band,
                                 "stated": bool(first.get("band_stated")), "reference": first.get("reference")}
        if band is None:
            out.append({**entry, "sensitive": False})
            continue
        at = {"registered": verdict_at(scored, expect, group, tau)}
        lo, hi = band
        points = grid(band, tau, first.get("reference"))
        on_grid = [[t, verdict_at(scored, expect, group, t)] for t in points]
        edges = sorted({e for e in _edges(members) if lo < e < hi})
        cuts = [lo] + edges + [hi]
        segments = [verdict_at(scored, expect, group, (a + b) / 2) for a, b in zip(cuts[:-1], cuts[1:])]
        flips = [{"at": e, "below": segments[i], "above": segments[i + 1]}
                 for i, e in enumerate(edges) if segments[i] != segments[i + 1]]
        seen = {v for _, v in on_grid} | set(segments) | {verdict_at(scored, expect, group, lo),
                                                          verdict_at(scored, expect, group, hi)}
        nearest = min(flips, key=lambda f: abs(f["at"] - tau)) if flips else None
        out.append({**entry, "verdict": at["registered"], "verdict_low": verdict_at(scored, expect, group, lo),
                    "verdict_high": verdict_at(scored, expect, group, hi), "grid": on_grid, "flips": flips,
                    "flip_point": nearest["at"] if nearest else None, "sensitive": seen != {at["registered"]}})
    return out


def annotate(record: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """``record`` (a scored check's result) with its threshold's ``band``, whether the
    band is stated in the config (``band_stated``) and its ``reference`` value."""
    tau = float(record.get("threshold", math.nan))
    return {**record, "band": band_of(spec, tau), "band_stated": spec.get("band") is not None,
            "reference": None if spec.get("band") is not None else reference(spec)}


def sensitivity_text(bands: list[dict[str, Any]]) -> str:
    """One line per sensitive threshold: ``threshold T (registered 0.99, band [0.98,
    0.995]): reproduced below 0.9875, mixed above``; empty when none is sensitive."""
    from .claims import fmt

    parts = []  # flip points with 4 digits: two interval ends can share their first 3
    for b in bands:
        if not b.get("sensitive"):
            continue
        flips = "; ".join(f"{f['below']} below {f['at']:.4g}, {f['above']} above" for f in b.get("flips", [])) or (
            f"{b.get('verdict_low')} at {fmt(b['band'][0])}, {b.get('verdict_high')} at {fmt(b['band'][1])}")
        parts.append(f"{b['threshold']} (registered {fmt(b['registered'])}, band {fmt(b['band'][0])} to "
                     f"{fmt(b['band'][1])}): {flips}")
    return " | ".join(parts)


def where_bands(table: Any, rule: dict[str, Any], verdict: str, setting: str, ctx: Any,
                factor: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Bands of the selection thresholds of a rule: a ``min`` / ``max`` over the layers
    ``where`` another metric passes a bound (``where: {metric, op, value}``) is read with
    that bound at ×½ to ×2 of its value (or a stated ``band`` in the ``where``). The
    selection changes only where the bound crosses a layer's pooled mean of the other
    metric, so the rule is evaluated once per segment between those means (exact flip
    points). Copies a ``for_each`` makes of one check move together."""
    from .claims import _evaluate_rule, expand_checks
    from .quantities import MissingData, _layer_curve

    specs = expand_checks(rule["checks"])
    out = []
    for group in dict.fromkeys(group_of({"check": c.get("name", "")}) for c in specs
                               if not c.get("informational") and "where" in c.get("lhs", {})):
        members = [i for i, c in enumerate(specs) if group_of({"check": c.get("name", "")}) == group
                   and not c.get("informational") and "where" in c.get("lhs", {})]
        where = specs[members[0]]["lhs"]["where"]
        v0 = float(where["value"])
        band = sorted(float(x) for x in where["band"]) if where.get("band") else sorted((v0 / 2, v0 * 2))
        edges = set()
        for i in members:
            try:
                _, _, M, _ = _layer_curve(table, str(where["metric"]), dict(specs[i]["lhs"].get("select", {})), setting, ctx)
            except MissingData:
                continue
            edges |= {float(x) for x in M[0] if band[0] < x < band[1]}
        cuts = [band[0]] + sorted(edges) + [band[1]]

        def at(v: float) -> str:
            moved = [{**c, "lhs": {**c["lhs"], "where": {**c["lhs"]["where"], "value": v}}} if i in members else c
                     for i, c in enumerate(specs)]
            try:
                return _evaluate_rule(table, {**rule, "checks": moved}, setting, ctx, factor)["verdict"]
            except MissingData:
                return "not run"

        segments = [at((a + b) / 2) for a, b in zip(cuts[:-1], cuts[1:])]
        flips = [{"at": e, "below": segments[i], "above": segments[i + 1]}
                 for i, e in enumerate(cuts[1:-1]) if segments[i] != segments[i + 1]]
        low, high = at(band[0]), at(band[1])
        nearest = min(flips, key=lambda f: abs(f["at"] - v0)) if flips else None
        out.append({"threshold": f"{group}: where {where['metric']} {where.get('op', '>=')} value",
                    "registered": v0, "op": where.get("op", ">="), "band": band, "stated": bool(where.get("band")),
                    "reference": 0.0, "verdict": verdict, "verdict_low": low, "verdict_high": high, "grid": [],
                    "flips": flips, "flip_point": nearest["at"] if nearest else None,
                    "sensitive": set(segments) | {low, high} != {verdict}})
    return out
