"""Positive and negative controls of a claim rule, read through the real pipeline
(docs/reproduce.md, "Controls" and "Power and near-threshold controls").

A claim's config names two controls, ``positive`` (the effect certainly present) and
``negative`` (absent by construction), each ``{why, edits}``: the claim's own rule with
its selections redirected to other rows of the same run. An edit applies to every
quantity of every check (``num``/``den`` included) that matches it:

- ``where``: ``{column: value}`` of the quantity's ``select`` (``metric``: its metric)
  that must all match; absent = every quantity;
- ``side``: ``lhs``, ``rhs`` or ``both`` (default);
- ``replace``: ``{column: {old: new}}``; ``set``: ``{column: value}``; ``drop``: columns;
- ``quantity``: fields of the quantity itself (``metric``, ``layer``, ``stat``, ...).

The positive control must read ``reproduced``, the negative one of :data:`PASSING`.
:func:`assess` adds each scored check's *power* on its own noise (:func:`power`) and a
*near-threshold* control of each threshold (:func:`near_threshold`).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .claims import _evaluate_rule, _outcome, group_of, outcome_at, scored_checks, verdict_from
from .quantities import EvalContext
from .rules import edit_rule

EXPECTED = {"positive": "reproduced", "negative": "not reproduced"}
#: Verdicts that pass each control.
PASSING = {"positive": ("reproduced",), "negative": ("not reproduced", "not reproduced where decidable")}


def control_rule(rule: dict[str, Any], control: dict[str, Any]) -> dict[str, Any]:
    """``rule`` with ``control['edits']`` applied (:func:`.claims.edit_rule`, which raises for a bad edit)."""
    return edit_rule(rule, control.get("edits", []))


def evaluate_controls(table: pd.DataFrame, claim: dict[str, Any], *, depth: int | None = None,
                      n_boot: int | None = None, setting: str = "default",
                      n_tokens: int | None = None) -> dict[str, Any] | None:
    """``{positive: {...}, negative: {...}, ok}``: the verdicts of ``claim``'s controls on
    the rows of ``setting``; ``ok`` None when either did not run. None without controls."""
    spec = claim.get("controls")
    if not spec:
        return None
    seed = sum(map(ord, str(claim.get("id", ""))))
    out: dict[str, Any] = {}
    for kind, expected in EXPECTED.items():
        control = spec[kind]
        ctx = EvalContext(depth=depth, seed=seed, n_tokens=n_tokens, **({"n_boot": n_boot} if n_boot else {}))
        res = _evaluate_rule(table, control_rule(claim["rule"], control), setting, ctx)
        out[kind] = {"why": " ".join(str(control.get("why", "")).split()), "expected": expected,
                     "verdict": res["verdict"], "passed": res["verdict"] in PASSING[kind], "measured": res["measured"],
                     "interval": res["interval"], "bound": res.get("bound"), "decisive": res.get("decisive", ""),
                     "checks": res["checks"], **({"missing": res["missing"]} if "missing" in res else {})}
    ran = all(out[k]["verdict"] != "not run" for k in EXPECTED)
    out["ok"] = all(out[k]["passed"] for k in EXPECTED) if ran else None
    return out


#: The power reading of a check without a band or an attainable end to test at.
NOT_ASSESSED = "not assessed (no band: the threshold is the no-effect value)"

#: Relative distance of the near-threshold inputs from the threshold (:func:`near_threshold`).
NEAR = 1e-6


def attainable(check: dict[str, Any]) -> tuple[float, float]:
    """The range of a check's statistic: [-1, 1] for a rank correlation against a constant."""
    if check.get("statistic") == "value" and str(check.get("text", "")).startswith("spearman"):
        return (-1.0, 1.0)
    return (-math.inf, math.inf)


def _moved(check: dict[str, Any], v: float) -> tuple[float, float]:
    """The check's interval carried to the true value ``v`` (scaled for a positive ratio, else shifted)."""
    lo, hi = check["interval"]
    t = check["value"]
    if lo > 0 and t > 0 and v > 0 and check.get("reference") == 0.0 and attainable(check)[1] == math.inf:
        return (lo * v / t, hi * v / t)
    return (v - (t - lo), v + (hi - t))


def _ends(check: dict[str, Any]) -> tuple[float, float]:
    """(truth where the check must hold, truth where it must fail) of :func:`power`."""
    op, band = check["op"], check.get("band")
    rlo, rhi = attainable(check)
    if op == "within":
        return (1.0, band[1] if band else math.inf)
    up = op in (">=", ">")
    pass_at = (band[1] if up else band[0]) if band else (rhi if up else rlo)
    fail_at = (band[0] if up else band[1]) if band else (rlo if up else rhi)
    return (min(max(pass_at, rlo), rhi), min(max(fail_at, rlo), rhi))


def power(check: dict[str, Any]) -> dict[str, Any] | None:
    """Whether a scored check can hold with the truth at the passing end of its band and
    fail at the failing end, on its own noise (``reading``); None for a check that
    decides nothing."""
    if check.get("informational") or check.get("outcome") == "missing" or check.get("bound") == "undecidable":
        return None
    iv, t = check.get("interval") or [None, None], check.get("value")
    if None in iv or t is None or not all(map(math.isfinite, [*iv, t])):
        return None
    pass_at, fail_at = _ends(check)
    tau, op, bound = check["threshold"], check["op"], check.get("bound")
    if not (math.isfinite(pass_at) and math.isfinite(fail_at)):
        return {"check": check.get("check", ""), "noise": [t - iv[0], iv[1] - t], "pass_at": None, "holds_there": None,
                "fail_at": None, "fails_there": None, "reading": NOT_ASSESSED}
    holds = _outcome(op, *_moved(check, pass_at), tau, bound) == "holds"
    fails = _outcome(op, *_moved(check, fail_at), tau, bound) == "fails"
    reading = {(True, True): "can pass and fail", (False, True): "cannot pass", (True, False): "cannot fail",
               (False, False): "cannot pass or fail"}[(holds, fails)]
    return {"check": check.get("check", ""), "noise": [t - iv[0], iv[1] - t], "pass_at": pass_at,
            "holds_there": holds, "fail_at": fail_at, "fails_there": fails, "reading": reading}


def _just(check: dict[str, Any], inside: bool) -> float:
    tau, op = check["threshold"], check["op"]
    step = NEAR * max(abs(tau), 1.0)
    if op == "within":
        return tau - step if inside else tau + step
    up = op in (">=", ">")
    return tau + step if up == inside else tau - step


def near_threshold(scored: list[dict[str, Any]], expect: str = "all") -> list[dict[str, Any]]:
    """Per threshold: synthetic values just inside and outside it (:data:`NEAR`), every
    other check just inside its own, through the decision code; ``ok`` when they hold
    and fail, the verdicts differ and the inside value is attainable."""
    def synthetic(r: dict[str, Any], inside: bool) -> dict[str, Any]:
        v = _just(r, inside)
        return {**r, "value": v, "interval": [v, v], "bound": None, "factor_off": None, "outcome": None}

    live = [r for r in scored if r.get("outcome") != "missing" and "threshold" in r]
    out = []
    for group in dict.fromkeys(group_of(r) for r in live):
        inside = [synthetic(r, True) for r in live]
        outside = [synthetic(r, group_of(r) != group) for r in live]
        first = next(r for r in live if group_of(r) == group)
        k = live.index(first)
        lo, hi = attainable(first)
        v_in, v_out = inside[k]["value"], outside[k]["value"]
        o_in, o_out = outcome_at(inside[k]), outcome_at(outside[k])
        verdicts = [verdict_from([outcome_at(r) for r in rs], expect) for rs in (inside, outside)]
        out.append({"threshold": group, "op": first["op"], "registered": first["threshold"], "just_inside": v_in,
                    "just_outside": v_out, "outcome_inside": o_in, "outcome_outside": o_out,
                    "verdict_inside": verdicts[0], "verdict_outside": verdicts[1],
                    "ok": o_in == "holds" and o_out == "fails" and verdicts[0] != verdicts[1] and lo <= v_in <= hi})
    return out


def assess(rec: dict[str, Any], expect: str = "all") -> dict[str, Any]:
    """``rec`` with ``power``, ``near_threshold`` and ``power_ok`` (None when nothing was decided)."""
    scored = scored_checks(rec.get("checks", []))
    pw = [p for p in map(power, scored) if p]
    near = near_threshold(scored, expect)
    ok = (all(p["reading"] in ("can pass and fail", NOT_ASSESSED) for p in pw) and all(n["ok"] for n in near)
          ) if (pw or near) else None
    return {**rec, "power": pw, "near_threshold": near, "power_ok": ok}
