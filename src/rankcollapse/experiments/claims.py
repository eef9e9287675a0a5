"""Pre-registered claims: each of the paper's measured effects is a rule evaluated on
the tidy table, giving one of :data:`VERDICTS` (docs/reproduce.md, "Claims").

A rule is a list of checks ``lhs OP factor * rhs`` between quantities read from the
table (:mod:`.quantities`; each reads exactly one condition):

- ``{stat: value, metric, layer, select}``: the mean at ``layer`` (``last`` = the claim
  depth for simulated networks, the deepest layer otherwise);
- ``{stat: change, metric, layer, from, select}``: ``value(layer) / value(from)``;
- ``{stat: min | max, metric, select, from_layer, where}``: min / max over layers,
  ``where: {metric, op, value}`` keeping the layers where another metric passes a bound;
- ``{stat: spearman, metric, with, select, from_layer}``: Spearman's ρ across layers
  with the metric ``with`` (or the layer index, ``with: layer``);
- ``{stat: profile_spearman, metric, select, against, layer | over, from_layer}``:
  Spearman's ρ across input positions between two per-position profiles;
- ``{stat: rate, metric, select, from_layer}``: fitted per-layer rate ``exp(slope)`` of
  ``log value`` over layers ``from_layer`` (default 1) .. last;
- ``{stat: turn, metric, select, from_layer}``: ``min(max_l s_l, 1 / min_l s_l)`` of the
  steps ``s_l = value(l) / value(l - 1)``: at most 1 for a monotone curve;
- ``{stat: envelope_rate, n_tokens, select: {mask_spec}}``: Theorem 1's certified rate
  ``(1 - deg_max^{-r})^{1/r}`` (:mod:`rankcollapse.theory.envelope`);
- ``{stat: ratio | difference, num: Q, den: Q}``; ``{const: x}``.

A check's statistic T is ``lhs / rhs`` (``compare: ratio``, default), ``lhs - rhs``
(``compare: difference``) or ``lhs`` against a constant, with threshold τ = ``factor``
(times the constant). It *holds* when its 95 % bootstrap interval clears τ, *fails* when
the interval lies wholly on the other side, else is *undecided* (``within``: inside
``[1/τ, τ]``); a side at its floor makes T a bound (:mod:`.quantities`). ``for_each``
unrolls a check per value; ``informational: true`` checks are not scored. Outcomes
combine by ``expect`` (:func:`verdict_from`); a claim's ``factor`` is read off as well
(:func:`factor_contrast`); every threshold is read across its band (:func:`band_of`,
:func:`threshold_bands`, :func:`where_bands`).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .quantities import EvalContext, MissingData, Value, _condition, _paired, combine_bounds, evaluate  # noqa: F401
from .rules import _override_rule, expand_checks, factor_off_rule

UNDECIDABLE = "undecidable at this depth"
NOT_WHERE_DECIDABLE = "not reproduced where decidable"
THRESHOLD_SENSITIVE = "threshold-sensitive"
FACTOR_OFF_PASSES = "factor-off also passes"
VERDICTS = ("reproduced", "not reproduced", NOT_WHERE_DECIDABLE, "mixed", "mixed (depth-sensitive)", THRESHOLD_SENSITIVE,
            UNDECIDABLE, "not run")
_OPS = (">=", "<=", ">", "<", "within")


def quantity(table: pd.DataFrame, q: dict[str, Any], setting: str = "default",
             ctx: EvalContext | None = None) -> Value:
    """Evaluate quantity ``q`` (point estimate, bootstrap replicates, per-seed values)."""
    return evaluate(table, q, setting, ctx or EvalContext())


def _interval(reps: np.ndarray) -> tuple[float, float]:
    reps = reps[np.isfinite(reps)]
    if not reps.size:
        return (math.nan, math.nan)
    lo, hi = np.percentile(reps, [2.5, 97.5])
    return float(lo), float(hi)


def _outcome(op: str, lo: float, hi: float, tau: float, bound: str | None = None) -> str:
    """``holds`` / ``fails`` / ``undecided`` of ``[lo, hi]`` against ``tau`` (a ``lower`` bound has no upper end)."""
    if bound == "undecidable":
        return "undecidable"
    if bound == "lower":
        hi = math.inf
    elif bound == "upper":
        lo = -math.inf if op != "within" else 0.0
    if math.isnan(lo) or math.isnan(hi):
        return "undecided"
    if op == "within":  # within a factor tau either way: [1/tau, tau]
        return "holds" if lo >= 1 / tau and hi <= tau else "fails" if hi < 1 / tau or lo > tau else "undecided"
    up = {">=": (lo >= tau, hi < tau), ">": (lo > tau, hi <= tau),
          "<=": (hi <= tau, lo > tau), "<": (hi < tau, lo >= tau)}[op]
    return "holds" if up[0] else "fails" if up[1] else "undecided"


def outcome_at(check: dict[str, Any], tau: float | None = None) -> str:
    """Outcome of a check result against ``tau`` (default its own threshold);
    ``factor-off also passes`` where its ``factor_off`` arm holds as well."""
    tau = check["threshold"] if tau is None else tau
    if check.get("outcome") == "missing" or "interval" not in check:
        return "missing"
    on = _outcome(check["op"], *check["interval"], tau, check.get("bound"))
    off = check.get("factor_off") or {}
    if on == "holds" and off.get("interval") and _outcome(check["op"], *off["interval"], tau, off.get("bound")) == "holds":
        return FACTOR_OFF_PASSES
    return on


def evaluate_check(table: pd.DataFrame, check: dict[str, Any], setting: str = "default",
                   ctx: EvalContext | None = None) -> dict[str, Any]:
    """One check: statistic, 95 % bootstrap interval, outcome and per-seed values."""
    ctx = ctx or EvalContext()
    op = check.get("op", ">=")
    if op not in _OPS:
        raise ConfigError(f"unknown operator {op!r}; use one of {list(_OPS)}")
    compare = check.get("compare", "ratio")
    if compare not in ("ratio", "difference"):
        raise ConfigError(f"unknown compare {compare!r}; use ratio or difference")
    rhs_q = check.get("rhs", {"const": 1.0})
    lhs, rhs = quantity(table, check["lhs"], setting, ctx), quantity(table, rhs_q, setting, ctx)
    factor = float(check.get("factor", 0.0 if compare == "difference" else 1.0))
    with np.errstate(all="ignore"):
        if "const" in rhs_q:
            stat, reps, tau, kind = lhs.point, lhs.reps, factor * rhs.point, "value"
            per = dict(lhs.per_seed)
        elif compare == "difference":
            stat, reps, tau, kind = np.subtract(lhs.point, rhs.point), lhs.reps - rhs.reps, factor, "difference"
            per = _paired(lhs, rhs, np.subtract)
        else:  # numpy division: a denominator of exactly 0 gives inf or nan, as a `ratio` quantity does
            stat, reps, tau, kind = np.divide(lhs.point, rhs.point), lhs.reps / rhs.reps, factor, "ratio"
            per = _paired(lhs, rhs, np.divide)
    bound = lhs.bound if "const" in rhs_q else combine_bounds(lhs.bound, rhs.bound)
    lo, hi = _interval(reps)
    out = {"check": check.get("name", ""), "text": check_text(check), "statistic": kind, "value": float(stat),
           "interval": [lo, hi], "bound": bound, "threshold": float(tau), "op": op, "factor": factor,
           "lhs": _stats(lhs), "rhs": _stats(rhs), "collapsed": [lhs.collapsed, rhs.collapsed],
           "floors": [lhs.floor, rhs.floor], "dtypes": [lhs.dtype, rhs.dtype],
           "per_seed": {int(s): float(v) for s, v in per.items()}, "n_samples": max(lhs.n_samples, rhs.n_samples),
           "n_seeds": max(lhs.n_seeds, rhs.n_seeds), "outcome": _outcome(op, lo, hi, tau, bound)}
    if bound == "undecidable":
        out["decidable_to_layer"] = _decidable_to(lhs, rhs)
    if check.get("null_hypothesis"):
        out["null_hypothesis"] = " ".join(str(check["null_hypothesis"]).split())
    notes = "; ".join(dict.fromkeys(x for x in (lhs.finite_depth, rhs.finite_depth) if x))
    if notes:
        out["finite_depth"] = notes
    return out


def check_text(check: dict[str, Any]) -> str:
    """A check as its result records it: ``lhs op factor x rhs``."""
    compare = check.get("compare", "ratio")
    factor = float(check.get("factor", 0.0 if compare == "difference" else 1.0))
    return f"{_qtext(check['lhs'])} {check.get('op', '>=')} {factor:g} x {_qtext(check.get('rhs', {'const': 1.0}))}"


def _decidable_to(lhs: Value, rhs: Value) -> int | None:
    """Deepest layer at which both sides were above their floors (None if none)."""
    if lhs.live is None:
        return None
    both = set(lhs.live) & set(rhs.live) if rhs.live is not None else set(lhs.live)
    return max(both) if both else None


def _stats(v: Value) -> dict[str, Any]:
    lo, hi = _interval(v.reps)
    return {"mean": float(v.point), "interval": [lo, hi], "collapsed": v.collapsed, "bound": v.bound,
            "floor": v.floor, "dtype": v.dtype, "n_seeds": v.n_seeds, "n_samples": v.n_samples}


def _qtext(q: dict[str, Any]) -> str:
    if "const" in q:
        return f"{q['const']:g}"
    stat = q.get("stat", "value")
    if stat in ("ratio", "difference"):
        return f"({_qtext(q['num'])} {'/' if stat == 'ratio' else '-'} {_qtext(q['den'])})"
    if stat == "envelope_rate":
        n_tokens = q.get("n_tokens")
        return f"theorem1_envelope_rate[mask_spec={q.get('select', {}).get('mask_spec')},N={n_tokens}]"
    sel = ",".join(f"{k}={v}" for k, v in q.get("select", {}).items())
    fl = q.get("from_layer")
    where = {"value": f"@{q.get('layer', 'last')}", "change": f"@{q.get('layer', 'last')}/@{q.get('from', 0)}",
             "min": f"@{fl}.." if fl else "", "max": f"@{fl}.." if fl else "",
             "rate": f"@{fl if fl is not None else 1}..last", "turn": f"@{fl or 0}..last"}.get(stat, "")
    if "where" in q:
        w = q["where"]
        where += f"(where {w.get('metric')} {w.get('op', '>=')} {w.get('value')})"
    if stat == "spearman":
        return f"spearman({q['metric']}, {q.get('with', 'layer')}){'@' + str(fl) + '..' if fl else ''}[{sel}]"
    if stat == "profile_spearman":
        vs = ",".join(f"{k}={v}" for k, v in (q.get("against") or {}).items())
        at = f"@{q['layer']}" if q.get("layer") is not None else f" {q.get('over', 'median')} over layers{'@' + str(fl) + '..' if fl else ''}"
        return f"spearman_positions({q['metric']}[{sel}], [{vs}]){at}"
    head = {"value": "", "change": "change ", "min": "min_layers ", "max": "max_layers ", "rate": "rate ",
            "turn": "turn "}[stat]
    return f"{head}{q['metric']}{where}[{sel}]"


def verdict_from(outcomes: list[str], expect: str = "all") -> str:
    """Combine check outcomes into a verdict (docs/reproduce.md, "Intervals")."""
    if not outcomes:
        return "not run"
    holds, fails = outcomes.count("holds"), outcomes.count("fails")
    if "undecidable" in outcomes and holds + outcomes.count("undecidable") == len(outcomes):
        return UNDECIDABLE  # nothing against the claim, but a comparison the floors cannot decide
    if expect == "mixed":
        if holds and fails:
            return "reproduced"
        if holds == len(outcomes) or fails == len(outcomes):
            return "not reproduced"
        return "mixed"
    if expect != "all":
        raise ConfigError(f"unknown expect {expect!r}; use 'all' or 'mixed'")
    if holds == len(outcomes):
        return "reproduced"
    if fails == len(outcomes):
        return "not reproduced"
    if fails and not holds:  # every check that decides fails; the others decide nothing
        return NOT_WHERE_DECIDABLE
    return "mixed"


def evaluate_claim(table: pd.DataFrame, claim: dict[str, Any], setting: str = "default",
                   override: dict[str, Any] | None = None, *, depth: int | None = None,
                   depth_check: bool = True, n_boot: int | None = None, n_tokens: int | None = None) -> dict[str, Any]:
    """Verdict, decisive number and interval of one claim under one setting.

    ``override`` (a nearby setting) replaces the selected value of every column it
    changes, so the same rule reads the rows of the changed setting. ``depth`` is the
    claim depth D; with ``depth_check`` the rule is read again at 2 D (``last`` and the
    explicit layers of simulated networks doubled) where the rows reach it, and a verdict
    that differs there becomes ``mixed (depth-sensitive)``. ``n_tokens``: the run's tokens
    per window, which the round-off floors read (:func:`.quantities.row_floor`).
    """
    rule = _override_rule(claim["rule"], override or {})
    factor = claim.get("factor")
    seed = sum(map(ord, str(claim.get("id", ""))))  # fixed bootstrap draws per claim
    ctx = EvalContext(depth=depth, seed=seed, n_tokens=n_tokens, **({"n_boot": n_boot} if n_boot else {}))
    res = _evaluate_rule(table, rule, setting, ctx, factor)
    res["depth"] = depth
    if res["verdict"] == "not run":
        return res
    with_bands(res, rule.get("expect", "all"), where_bands(table, rule, res["verdict"], setting, ctx, factor))
    if not depth_check or depth is None:
        return res
    deep = _evaluate_rule(table, rule, setting, dataclasses.replace(ctx, depth=2 * depth, layer_factor=2, _cache={}), factor)
    if deep["verdict"] == "not run":
        res["depth_check"] = {"depth": 2 * depth, "verdict": "not run", "missing": deep.get("missing", "")}
        return res
    res["depth_check"] = {"depth": 2 * depth, "verdict": deep["verdict"], "measured": deep["measured"],
                          "interval": deep["interval"], "bound": deep.get("bound"), "n_samples": _fewest_windows(deep)}
    if deep["verdict"] == UNDECIDABLE:  # the floors end what 2 D can say; it contradicts nothing
        res["depth_check"]["decidable_to_layer"] = deep.get("decidable_to_layer")
        return res
    at_threshold = res.get("verdict_at_threshold", res["verdict"])
    if deep["verdict"] != at_threshold:
        res["verdict_at_depth"] = at_threshold
        res["verdict"] = "mixed (depth-sensitive)"
    return res


def _fewest_windows(res: dict[str, Any]) -> int:
    """The fewest windows a side of ``res``'s scored checks read (0: none reads windows)."""
    sides = [c[k].get("n_samples", 0) for c in scored_checks(res["checks"]) for k in ("lhs", "rhs") if k in c]
    return min((n for n in sides if n > 0), default=0)


def scored_checks(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checks that decide a verdict (not ``informational``), in rule order."""
    return [c for c in checks if not c.get("informational")]


def registered_verdict(res: dict[str, Any]) -> str:
    """The verdict of a result at the registered thresholds."""
    return res.get("verdict_at_threshold") or res["verdict"]


def with_bands(res: dict[str, Any], expect: str = "all", selection: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """``res`` with ``bands`` (:func:`threshold_bands` plus the ``selection`` bands of
    :func:`where_bands`); a verdict that changes inside a band becomes ``threshold-sensitive``."""
    res["bands"] = threshold_bands(scored_checks(res["checks"]), expect) + list(selection)
    if any(b["sensitive"] for b in res["bands"]):
        res["verdict_at_threshold"] = res["verdict"]
        res["verdict"] = THRESHOLD_SENSITIVE
    return res


def _evaluate_rule(table: pd.DataFrame, rule: dict[str, Any], setting: str, ctx: EvalContext,
                   factor: dict[str, Any] | None = None) -> dict[str, Any]:
    specs = expand_checks(rule["checks"])
    checks = []
    for c in specs:
        info = bool(c.get("informational", False))
        try:
            res = evaluate_check(table, c, setting, ctx)
        except MissingData as exc:
            if not info:
                return {"verdict": "not run", "measured": None, "interval": None, "checks": [], "missing": str(exc),
                        "missing_select": exc.select, "n_samples": 0, "n_seeds": 0}
            res = {"check": c.get("name", ""), "text": str(exc), "outcome": "missing", "value": math.nan,
                   "interval": [math.nan, math.nan], "per_seed": {}, "n_samples": 0, "n_seeds": 0}
        res["informational"] = info
        checks.append(res if info else annotate(res, c))
    if factor:
        checks = factor_contrast(table, rule, checks, factor, setting, ctx)
    scored = scored_checks(checks)
    verdict = verdict_from([c["outcome"] for c in scored], rule.get("expect", "all"))
    key = decisive(scored, verdict)
    return {"verdict": verdict, "measured": key["value"] if key else None, "interval": key["interval"] if key else None,
            "bound": key.get("bound") if key else None, "decidable_to_layer": key.get("decidable_to_layer") if key else None,
            "decisive": key["check"] if key else "", "checks": checks,
            "n_samples": max((c["n_samples"] for c in scored), default=0),
            "n_seeds": max((c["n_seeds"] for c in scored), default=0)}


def factor_contrast(table: pd.DataFrame, rule: dict[str, Any], checks: list[dict[str, Any]],
                    factor: dict[str, Any], setting: str = "default", ctx: EvalContext | None = None
                    ) -> list[dict[str, Any]]:
    """The scored ``checks`` with their ``factor_off`` arm (where the edits change the
    check) and the outcome it settles (:func:`outcome_at`)."""
    ctx = ctx or EvalContext()
    off_specs = factor_off_rule(rule, factor)["checks"]
    out = []
    for res, on, off in zip(checks, expand_checks(rule["checks"]), off_specs):
        if res["informational"] or off == on or res.get("outcome") == "missing":
            out.append(res)
            continue
        try:
            arm = evaluate_check(table, off, setting, ctx)
            arm = {k: arm[k] for k in ("text", "value", "interval", "bound", "outcome")}
        except MissingData as exc:
            arm = {"text": _qtext(off["lhs"]), "missing": str(exc)}
        res = {**res, "factor_off": arm}
        out.append({**res, "outcome": outcome_at(res)})
    return out


def decisive(checks: list[dict[str, Any]], verdict: str) -> dict[str, Any] | None:
    """The check that decides the verdict: the first one going against it, else the
    decided check nearest its threshold; an undecided one only when none decides."""
    if not checks:
        return None
    against = {"not reproduced": ("fails",), NOT_WHERE_DECIDABLE: ("fails",), "mixed": ("fails",),
               UNDECIDABLE: ("undecidable",)}.get(verdict, ())
    hit = next((c for want in against for c in checks if c["outcome"] == want), None)
    if hit is not None:
        return hit
    decided = [c for c in checks if c["outcome"] in ("holds", "fails")]
    return min(decided or checks, key=_margin)


def _margin(c: dict[str, Any]) -> float:
    lo, hi = c["interval"]
    if c.get("bound") == "lower":
        hi = math.inf
    elif c.get("bound") == "upper":
        lo = -math.inf
    tau = c["threshold"]
    if c["op"] == "within":  # the nearer of the two bounds 1/tau and tau, relative to each
        edges = ((lo - 1 / tau) * tau, (tau - hi) / tau)
        return min(edges) if all(map(math.isfinite, edges)) else math.inf
    edge = (lo - tau) if c["op"] in (">=", ">") else (tau - hi)
    scale = abs(tau) if tau else 1.0
    return edge / scale if math.isfinite(edge) else math.inf


def rule_text(claim: dict[str, Any]) -> str:
    """Human-readable rule: the statement plus every check."""
    rule = claim["rule"]
    expect = rule.get("expect", "all")
    head = ("reproduced iff the 95% interval of every check clears its threshold" if expect == "all" else
            "reproduced iff at least one check holds and at least one fails (the paper's effect is mixed)")
    parts = []
    for c in expand_checks(rule["checks"]):
        rhs = c.get("rhs", {"const": 1.0})
        if c.get("op") == "within":
            body = f"{_qtext(c['lhs'])} within a factor {float(c.get('factor', 1)):g} of {_qtext(rhs)}"
        elif "const" in rhs:
            body = f"{_qtext(c['lhs'])} {c.get('op', '>=')} {float(c.get('factor', 1)) * float(rhs['const']):g}"
        elif c.get("compare") == "difference":
            body = f"{_qtext(c['lhs'])} - {_qtext(rhs)} {c.get('op', '>=')} {float(c.get('factor', 0)):g}"
        else:
            body = f"{_qtext(c['lhs'])} / {_qtext(rhs)} {c.get('op', '>=')} {float(c.get('factor', 1)):g}"
        parts.append(("(info) " if c.get("informational") else "") + body)
    return f"{rule.get('statement', '')} [{head}: {'; '.join(parts)}]".strip()


def claim_record(claim: dict[str, Any], experiment: str, result: dict[str, Any], *,
                 excluded_models: tuple[str, ...] = (), scale: str = "",
                 controls: dict[str, Any] | None = None) -> dict[str, Any]:
    """The claims.json object of one claim (``excluded_models``: those the scale leaves out)."""
    original = claim.get("original") or {}
    rec = {"id": claim["id"], "effect": claim["effect"], "paper_effect": claim.get("paper_effect", ""),
           "where": claim.get("where", ""), "measured_quantity": claim.get("measured_quantity", ""),
           "verdict": result["verdict"], "measured": result["measured"], "interval": result["interval"],
           "bound": result.get("bound"), "decidable_to_layer": result.get("decidable_to_layer"),
           "decisive": result.get("decisive", ""), "rule": rule_text(claim), "depth": result.get("depth"),
           "depth_check": result.get("depth_check"), "n_samples": result.get("n_samples", 0),
           "n_seeds": result.get("n_seeds", 0), "original_verdict": original.get("verdict"),
           "original_rule": original.get("rule"),
           "change_reason": " ".join(str(original.get("reason", "")).split()) or None,
           "earlier_amendments": [{k: " ".join(str(v).split()) for k, v in e.items()} for e in original.get("earlier", [])],
           "verdict_at_threshold": result.get("verdict_at_threshold"), "bands": result.get("bands", []),
           "factor": claim.get("factor", {}).get("name") if claim.get("factor") else None, "controls": controls,
           "controls_ok": (controls or {}).get("ok"), "checks": result["checks"], "experiment": experiment,
           "comparison": claim.get("comparison", ""), "plot": claim.get("plot", ""),
           "notes": claim.get("notes", "").strip(), "nearby": []}
    if claim.get("axis"):  # a claim's sequence-length axis (.axis): what was varied, on which rows
        rec["setting"] = claim["setting"]
        rec["axis"] = claim["axis"]
    if "missing" in result:
        model = result.get("missing_select", {}).get("model")
        if model in excluded_models:
            why = (f"Not run: the rule needs model {model}, which --scale {scale} excludes to stay fast; "
                   f"run `rankcollapse reproduce {experiment} --scale quick` to decide this claim.")
        else:
            why = "Not run: missing input: " + result["missing"] + "."
        rec["missing"] = result["missing"]
        rec["notes"] = (rec["notes"] + " " + why).strip()
    if controls and controls.get("ok") is False:
        bad = [k for k in ("positive", "negative") if not controls[k]["passed"]]
        rec["notes"] = (rec["notes"] + " Controls failed: " + ", ".join(
            f"{k} control reads {controls[k]['verdict']} (expected {controls[k]['expected']})" for k in bad)
            + "; the rule cannot be trusted on this run's inputs.").strip()
    return rec


def fmt_measured(value: float | None, interval: list[float] | None, bound: str | None = None,
                 decidable_to: int | None = None) -> str:
    """``12.3 [8.1, 20.4]``; a bound ``≥ 5.8e+06 (bound: ...)``; or ``undecidable at this depth``."""
    if bound == "undecidable":
        return UNDECIDABLE + (f" (decidable to layer {decidable_to})" if decidable_to is not None else "")
    if bound in ("lower", "upper"):
        lo, hi = interval or [value, value]
        edge = lo if bound == "lower" else hi
        return f"{'≥' if bound == 'lower' else '≤'} {fmt(edge)} (bound: one side at its floor)"
    return f"{fmt(value)} {fmt_interval(interval)}"


def fmt(x: float | None) -> str:
    """3 significant digits (``—`` for None; a negative zero reads 0)."""
    if x is None:
        return "—"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x + 0.0:.3g}"


def fmt_interval(iv: list[float] | None) -> str:
    """``[lo, hi]`` as ``[0.12, 0.34]`` (``—`` for None)."""
    return f"[{fmt(iv[0])}, {fmt(iv[1])}]" if iv else "—"


# ------------------------------------------------------------------ threshold bands
#: Points of the log-spaced grid across each band (both ends included).
GRID = 13


def group_of(record: dict[str, Any]) -> str:
    """The threshold a check record reads: its name without a ``for_each`` ``[key=value]`` suffix."""
    name = str(record.get("check") or record.get("text", ""))
    if name.endswith("]") and " [" in name:
        name = name.rsplit(" [", 1)[0]
    return name


def reference(spec: dict[str, Any]) -> float:
    """The no-effect value a check's threshold band is measured from."""
    rhs = spec.get("rhs", {"const": 1.0})
    if spec.get("op") == "within":  # within a factor tau either way: tau = 1 is exact agreement
        return 1.0
    return 1.0 if spec.get("lhs", {}).get("stat") in ("rate", "turn") and "const" in rhs else 0.0


def band_of(spec: dict[str, Any], tau: float) -> list[float] | None:
    """The band ``[lo, hi]`` of threshold ``tau`` (docs/reproduce.md, "Threshold bands");
    None at the no-effect value."""
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
    """:data:`GRID` values across ``band``, log-spaced in the distance from ``ref``."""
    lo, hi = band
    if ref is not None and (lo - ref) * (hi - ref) > 0:
        a, b = abs(lo - ref), abs(hi - ref)
        sign = 1.0 if lo > ref else -1.0
        return sorted(float(ref + sign * v) for v in np.geomspace(a, b, GRID))
    if lo > 0 or hi < 0:
        return [float(v) for v in np.geomspace(lo, hi, GRID)]
    return [float(v) for v in np.linspace(lo, hi, GRID)]


def _edges(records: list[dict[str, Any]]) -> list[float]:
    """Every τ at which an outcome of ``records`` can change (their interval ends)."""
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
    return verdict_from([outcome_at(r, tau if group_of(r) == group else r["threshold"]) for r in scored], expect)


def threshold_bands(scored: list[dict[str, Any]], expect: str = "all") -> list[dict[str, Any]]:
    """Per threshold of the :func:`annotate`-d ``scored`` records: band, verdicts at the
    registered threshold, its ends and on the grid, flip points and ``sensitive``."""
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
        at = partial(verdict_at, scored, expect, group)
        edges = sorted({e for e in _edges(members) if band[0] < e < band[1]})
        out.append(_band_reading(entry, edges, at, at(tau), grid(band, tau, first.get("reference"))))
    return out


def _band_reading(entry: dict[str, Any], edges: list[float], at, verdict: str, points: list[float] = ()
                  ) -> dict[str, Any]:
    """``entry`` with the verdicts ``at`` gives across its band: ends, ``points``, segments between ``edges``, flips."""
    lo, hi = entry["band"]
    cuts = [lo] + edges + [hi]
    segments = [at((a + b) / 2) for a, b in zip(cuts[:-1], cuts[1:])]
    flips = [{"at": e, "below": segments[i], "above": segments[i + 1]}
             for i, e in enumerate(edges) if segments[i] != segments[i + 1]]
    on_grid = [[t, at(t)] for t in points]
    low, high = at(lo), at(hi)
    nearest = min(flips, key=lambda f: abs(f["at"] - entry["registered"]))["at"] if flips else None
    return {**entry, "verdict": verdict, "verdict_low": low, "verdict_high": high, "grid": on_grid, "flips": flips,
            "flip_point": nearest, "sensitive": {v for _, v in on_grid} | set(segments) | {low, high} != {verdict}}


def annotate(record: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its threshold's ``band``, ``band_stated`` and ``reference``."""
    tau = float(record.get("threshold", math.nan))
    return {**record, "band": band_of(spec, tau), "band_stated": spec.get("band") is not None,
            "reference": None if spec.get("band") is not None else reference(spec)}


def where_bands(table: Any, rule: dict[str, Any], verdict: str, setting: str, ctx: Any,
                factor: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Bands of a rule's ``where`` bounds (×½ to ×2, or a stated ``band``), read once per
    segment between the layers' means of the ``where`` metric (exact flip points)."""
    specs = expand_checks(rule["checks"])
    groups = {i: group_of({"check": c.get("name", "")}) for i, c in enumerate(specs)
              if not c.get("informational") and "where" in c.get("lhs", {})}
    out = []
    for group in dict.fromkeys(groups.values()):
        members = [i for i, g in groups.items() if g == group]
        where = specs[members[0]]["lhs"]["where"]
        v0 = float(where["value"])
        band = sorted(float(x) for x in where["band"]) if where.get("band") else sorted((v0 / 2, v0 * 2))
        edges = set()
        for i in members:
            try:
                M = _condition(table, str(where["metric"]), dict(specs[i]["lhs"].get("select", {})), setting, ctx)[3]
            except MissingData:
                continue
            edges |= {float(x) for x in M[0] if band[0] < x < band[1]}

        def at(v: float) -> str:
            moved = [{**c, "lhs": {**c["lhs"], "where": {**c["lhs"]["where"], "value": v}}} if i in members else c
                     for i, c in enumerate(specs)]
            try:
                return _evaluate_rule(table, {**rule, "checks": moved}, setting, ctx, factor)["verdict"]
            except MissingData:
                return "not run"

        entry = {"threshold": f"{group}: where {where['metric']} {where.get('op', '>=')} value", "registered": v0,
                 "op": where.get("op", ">="), "band": band, "stated": bool(where.get("band")), "reference": 0.0}
        out.append(_band_reading(entry, sorted(edges), at, verdict))
    return out
