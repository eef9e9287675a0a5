"""Positive and negative controls of a claim rule, read through the real pipeline.

A rule that cannot pass (or cannot fail) on the configured inputs looks like a finding.
Each claim therefore names two controls in its config::

    controls:
      positive: {why: "...", edits: [...]}   # the effect certainly present
      negative: {why: "...", edits: [...]}   # the effect absent by construction

A control is the claim's own rule (same checks, operators, factors, statistics, floors
and bootstrap) with its selections redirected to other rows of the same run: rows of
units the configs run for that purpose (``role: control`` in a unit's params) or rows
the real data already has (the same condition on both sides of a comparison is the
simplest negative). An edit applies to every quantity of every check (``lhs``,
``rhs`` and the ``num``/``den`` of ratios) that matches it:

- ``where``: ``{column: value}`` of the quantity's ``select`` (``metric`` names the
  quantity's metric) that must all match; absent = every quantity;
- ``side``: ``lhs``, ``rhs`` or ``both`` (default);
- ``replace``: ``{column: {old: new}}``, a value mapped wherever it appears;
- ``set``: ``{column: value}`` written into the select; ``drop``: columns removed;
- ``quantity``: fields of the quantity itself (``metric``, ``layer``, ``stat``, ...).

The positive control must read ``reproduced``, the negative ``not reproduced`` or ``not
reproduced where decidable`` (every check it can decide fails; the others compare
round-off with round-off, which is no effect either way) (:func:`evaluate_controls`); a
claim whose controls do not is flagged in ``claims.json`` (``controls_ok: false``) and in
the report.

A check that reads a control condition (a random-init model beside the trained one)
states its ``null_hypothesis`` in the claim's direction: "the random-init model does not show the
trained direction" is one-sided (G2: ρ > -0.3, so a control at ρ = +0.99 passes it), and
"no effect" on a flat curve is an equivalence test with a margin in the metric's own
units (two one-sided checks, G4: the first-token mass within ±0.01 of its value under
uniform attention at every layer), never a rank correlation of noise.

Two more controls are computed for every claim from its scored checks
(:func:`assess`, in ``claims.json`` and ``reproduce audit``):

- *power* (:func:`power`): would the check decide an effect of its registered size,
  on its own noise? The noise is the check's 95 % bootstrap interval (windows and seeds
  resampled) around its value, carried to another true value by a scaling where the
  statistic and its interval are positive and its no-effect value is 0 (relative noise:
  a ratio, a growth), by a shift otherwise. The check must hold with the truth at the passing end of its threshold's
  band (twice the threshold's distance from the no-effect value, or the stated end;
  without a band, the end of the statistic's attainable range) and fail with the truth
  at the failing end. A check that cannot do one of the two is reported: ``cannot pass``
  (a lower bound against ``<=``, a noise wider than the band) or ``cannot fail``.
- *near the threshold* (:func:`near_threshold`): a synthetic check value just inside and
  just outside each threshold (relative distance :data:`NEAR`), run through the
  decision code the verdict takes (:func:`.claims.outcome_at`, :func:`.claims.verdict_from`)
  with every other check just inside its own: the rule must pass the one and not the
  other, and the inside value must be attainable (a rank correlation in [-1, 1]).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .quantities import EvalContext

EXPECTED = {"positive": "reproduced", "negative": "not reproduced"}
#: Verdicts that pass each control (module docstring).
PASSING = {"positive": ("reproduced",), "negative": ("not reproduced", "not reproduced where decidable")}


def control_rule(rule: dict[str, Any], control: dict[str, Any]) -> dict[str, Any]:
    """``rule`` with every check's quantities edited by ``control['edits']`` (loops
    unrolled first, so an edit sees the mask a ``for_each`` filled in;
    :func:`.claims.edit_rule`).

    Raises
    ------
    ConfigError
        An edit with an unknown key or side.
    """
    from .claims import edit_rule

    return edit_rule(rule, control.get("edits", []))


def evaluate_controls(table: pd.DataFrame, claim: dict[str, Any], *, depth: int | None = None,
                      n_boot: int | None = None, setting: str = "default",
                      n_tokens: int | None = None) -> dict[str, Any] | None:
    """Verdicts of ``claim``'s positive and negative controls on ``table`` at the claim
    depth, on the rows of ``setting`` (a claim axis's, :mod:`.axis`, or the default):
    ``{positive: {...}, negative: {...}, ok}`` where each entry holds ``why``,
    ``expected``, ``verdict``, ``passed``, ``measured``, ``interval`` and the checks;
    ``ok`` is True when both read as expected, None when either did not run (its rows
    are not in this run). None for a claim without controls. ``n_tokens``: the run's N
    (:func:`.quantities.row_floor`)."""
    from .claims import _evaluate_rule

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


#: The power reading of a check whose threshold is the no-effect value of an unbounded
#: statistic (no band, no attainable end): no registered effect size to test at.
NOT_ASSESSED = "not assessed (no band: the threshold is the no-effect value)"

#: Relative distance of the near-threshold inputs from the threshold (:func:`near_threshold`).
NEAR = 1e-6


def attainable(check: dict[str, Any]) -> tuple[float, float]:
    """The range the statistic of a scored check record can take: [-1, 1] for a rank
    correlation against a constant, unbounded otherwise."""
    if check.get("statistic") == "value" and str(check.get("text", "")).startswith("spearman"):
        return (-1.0, 1.0)
    return (-math.inf, math.inf)


def _moved(check: dict[str, Any], v: float) -> tuple[float, float]:
    """The check's interval carried to the true value ``v``: scaled where the statistic
    and its interval are positive and its no-effect value is 0 (relative noise: ratios,
    growths), shifted otherwise (rates against 1, differences, rank correlations)."""
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
    """Whether a scored check record can pass and can fail on its own noise (module
    docstring): ``{check, noise, pass_at, holds_there, fail_at, fails_there, reading}``
    with ``reading`` one of ``can pass and fail``, ``cannot pass``, ``cannot fail``,
    ``cannot pass or fail`` (:data:`NOT_ASSESSED` without a band or attainable end);
    None for an informational, missing or undecidable check."""
    from .claims import _outcome

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
    """Per threshold of the scored check records: synthetic values just inside and just
    outside it, decided by :func:`.claims.outcome_at` and :func:`.claims.verdict_from`
    with every other check just inside its own threshold (module docstring). ``ok``:
    the check holds inside and fails outside, the two verdicts differ and the inside
    value is attainable."""
    from .claims import group_of, outcome_at, verdict_from

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
    """``rec`` (a claims.json record) with ``power`` (:func:`power` of each scored
    check), ``near_threshold`` (:func:`near_threshold`) and ``power_ok``: False when a
    check cannot pass or cannot fail on its noise, or a threshold's near controls do not
    read as they must; None when nothing was decided (``not run``)."""
    scored = [k for k in rec.get("checks", []) if not k.get("informational")]
    pw = [p for p in map(power, scored) if p]
    near = near_threshold(scored, expect)
    ok = (all(p["reading"] in ("can pass and fail", NOT_ASSESSED) for p in pw) and all(n["ok"] for n in near)
          ) if (pw or near) else None
    return {**rec, "power": pw, "near_threshold": near, "power_ok": ok}
