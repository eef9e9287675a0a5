"""Pre-registered claims: each of the paper's measured effects is a rule evaluated on
the tidy table, giving ``reproduced`` / ``not reproduced`` / ``mixed``.

A rule is a list of checks ``lhs OP factor * rhs`` between *quantities* read from the
table, evaluated separately for every weight seed:

- ``{stat: value, metric, layer, select}``: the mean over windows at ``layer``
  (``layer: last`` = deepest layer present);
- ``{stat: change, metric, layer, from, select}``: ``value(layer) / value(from)``
  (``from`` defaults to 0, the input);
- ``{stat: min | max, metric, select, from_layer}``: min / max over layers
  ``>= from_layer`` (default 0) of the mean;
- ``{stat: ratio, num: Q, den: Q}``: quotient of two quantities;
- ``{const: x}``.

``select`` filters rows by column (a list means any of). Rows of the ``final_norm``
point (a pretrained model's last entry, after its final norm, sharing the last block's
layer index) are left out unless ``select`` names a ``point``. A check with
``floor: x`` clips both sides to at least ``x`` before comparing, so two values at the
floating-point floor (e.g. μ/‖X‖_F ~ 1e-16 after full collapse in float64) compare
as equal instead of their rounding noise deciding the outcome. A check with
``for_each: {key: [v1, v2]}`` stands for one copy per value, with every ``"{key}"``
string in its selects replaced. A check marked ``informational: true`` is measured and
reported but does not enter the verdict. A check *holds* when it is
true for every seed, *fails* when false for every seed, and is *split* otherwise.
``expect: all`` (default): all checks hold -> reproduced; all fail -> not reproduced;
anything else -> mixed. ``expect: mixed`` encodes a paper effect that is itself mixed:
at least one check holds and one fails -> reproduced; all hold or all fail -> not
reproduced; otherwise mixed. Missing rows give ``not run``.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError

VERDICTS = ("reproduced", "not reproduced", "mixed", "not run")
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


class MissingData(LookupError):
    """The table holds no rows for a quantity's selection."""


def _select(table: pd.DataFrame, select: dict[str, Any], setting: str) -> pd.DataFrame:
    keep = table["setting"] == setting
    for col, want in select.items():
        if col not in table:
            raise ConfigError(f"claim selects on unknown column {col!r}")
        wants = want if isinstance(want, list) else [want]
        if table[col].dtype.kind == "f":
            hit = np.zeros(len(table), dtype=bool)
            for w in wants:
                hit |= np.isclose(table[col].to_numpy(), float(w))
            keep &= hit
        else:
            keep &= table[col].astype(str).isin([str(w) for w in wants])
    return table[keep]


def _per_seed_mean(rows: pd.DataFrame) -> pd.DataFrame:
    return rows.groupby(["seed", "layer"], as_index=False)["mean"].mean()


def quantity(table: pd.DataFrame, q: dict[str, Any], setting: str = "default") -> pd.Series:
    """Evaluate quantity ``q`` per seed; a Series indexed by seed (``-1`` = no seed)."""
    if "const" in q:
        return pd.Series({-1: float(q["const"])})
    stat = q.get("stat", "value")
    if stat == "ratio":
        num, den = quantity(table, q["num"], setting), quantity(table, q["den"], setting)
        num, den = _align(num, den)
        return num / den
    rows = _select(table, {**q.get("select", {}), "metric": q["metric"]}, setting)
    if "point" not in q.get("select", {}):
        rows = rows[rows["point"] != "final_norm"]
    if rows.empty:
        err = MissingData(f"no rows for metric={q['metric']} select={q.get('select', {})} setting={setting}")
        err.select = dict(q.get("select", {}))
        raise err
    means = _per_seed_mean(rows)
    out = {}
    for seed, grp in means.groupby("seed"):
        series = grp.set_index("layer")["mean"]
        if stat in ("min", "max"):
            out[seed] = float(getattr(series[series.index >= int(q.get("from_layer", 0))], stat)())
            continue
        layer = _layer(series, q.get("layer", "last"))
        val = float(series.loc[layer])
        if stat == "change":
            val = val / float(series.loc[_layer(series, q.get("from", 0))])
        elif stat != "value":
            raise ConfigError(f"unknown quantity stat {stat!r}")
        out[seed] = val
    return pd.Series(out)


def _layer(series: pd.Series, layer: Any) -> int:
    if layer == "last":
        return int(series.index.max())
    if int(layer) not in series.index:
        raise MissingData(f"layer {layer} not in table (have {series.index.min()}..{series.index.max()})")
    return int(layer)


def _align(a: pd.Series, b: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Pair values by seed; a side without seeds (index ``[-1]``: a constant or a
    pretrained model) is broadcast to the other side's seeds."""
    if list(a.index) == [-1]:
        a = pd.Series(a.iloc[0], index=b.index)
    elif list(b.index) == [-1]:
        b = pd.Series(b.iloc[0], index=a.index)
    common = a.index.intersection(b.index)
    if common.empty:
        raise MissingData("the two sides of a check share no seed")
    return a.loc[common], b.loc[common]


def evaluate_check(table: pd.DataFrame, check: dict[str, Any], setting: str = "default") -> dict[str, Any]:
    """One check: per-seed values, outcome ``holds`` / ``fails`` / ``split``."""
    op = check.get("op", ">=")
    if op not in _OPS:
        raise ConfigError(f"unknown operator {op!r}; use one of {list(_OPS)}")
    factor = float(check.get("factor", 1.0))
    lhs, rhs = _align(quantity(table, check["lhs"], setting), quantity(table, check.get("rhs", {"const": 1.0}), setting))
    if "floor" in check:
        lhs, rhs = lhs.clip(lower=float(check["floor"])), rhs.clip(lower=float(check["floor"]))
    ok = np.array([_OPS[op](float(l), factor * float(r)) for l, r in zip(lhs, rhs)])
    outcome = "holds" if ok.all() else "fails" if not ok.any() else "split"
    return {
        "check": check.get("name", ""),
        "text": f"{_qtext(check['lhs'])} {op} {factor:g} x {_qtext(check.get('rhs', {'const': 1.0}))}",
        "lhs": _stats(lhs),
        "rhs": _stats(rhs),
        "per_seed": {int(s): [float(l), float(r), bool(k)] for s, l, r, k in zip(lhs.index, lhs, rhs, ok)},
        "op": op,
        "factor": factor,
        "floor": check.get("floor"),
        "outcome": outcome,
    }


def _stats(s: pd.Series) -> dict[str, float]:
    v = s.to_numpy(dtype=float)
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max()), "n_seeds": int(len(v))}


def _qtext(q: dict[str, Any]) -> str:
    if "const" in q:
        return f"{q['const']:g}"
    stat = q.get("stat", "value")
    if stat == "ratio":
        return f"({_qtext(q['num'])} / {_qtext(q['den'])})"
    sel = ",".join(f"{k}={v}" for k, v in q.get("select", {}).items())
    where = {"value": f"@{q.get('layer', 'last')}", "change": f"@{q.get('layer', 'last')}/@{q.get('from', 0)}",
             "min": f"@{q.get('from_layer', 0)}.." if q.get("from_layer") else "",
             "max": f"@{q.get('from_layer', 0)}.." if q.get("from_layer") else ""}.get(stat, "")
    head = {"value": "", "change": "change ", "min": "min_layers ", "max": "max_layers "}[stat]
    return f"{head}{q['metric']}{where}[{sel}]"


def verdict_from(outcomes: list[str], expect: str = "all") -> str:
    """Combine check outcomes into a verdict (see module docstring)."""
    if not outcomes:
        return "not run"
    holds, fails = outcomes.count("holds"), outcomes.count("fails")
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
    return "mixed"


def expand_checks(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unroll ``for_each`` templates (see module docstring)."""
    out = []
    for c in checks:
        loops = c.get("for_each")
        if not loops:
            out.append(c)
            continue
        keys = list(loops)
        for combo in _product([loops[k] for k in keys]):
            sub = dict(zip(keys, combo))
            body = {k: v for k, v in c.items() if k != "for_each"}
            body = _fill(body, sub)
            body["name"] = f"{c.get('name', 'check')} [{', '.join(f'{k}={v}' for k, v in sub.items())}]"
            out.append(body)
    return out


def _product(lists: list[list[Any]]) -> list[tuple]:
    import itertools

    return list(itertools.product(*lists))


def _fill(obj: Any, sub: dict[str, Any]) -> Any:
    if isinstance(obj, dict):
        return {k: _fill(v, sub) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, sub) for v in obj]
    if isinstance(obj, str) and obj.startswith("{") and obj.endswith("}") and obj[1:-1] in sub:
        return sub[obj[1:-1]]
    return obj


def evaluate_claim(table: pd.DataFrame, claim: dict[str, Any], setting: str = "default",
                   override: dict[str, Any] | None = None) -> dict[str, Any]:
    """Verdict and measured numbers of one claim under one setting.

    ``override`` (a nearby setting) replaces the selected value of every column it
    changes, so the same rule reads the rows of the changed setting.
    """
    rule = _override_rule(claim["rule"], override or {})
    try:
        checks = []
        for c in expand_checks(rule["checks"]):
            info = bool(c.get("informational", False))
            try:
                res = evaluate_check(table, c, setting)
            except MissingData as exc:
                if not info:
                    raise
                res = {"check": c.get("name", ""), "text": str(exc), "outcome": "missing",
                       "lhs": _stats(pd.Series([np.nan])), "rhs": _stats(pd.Series([np.nan])), "per_seed": {}}
            res["informational"] = info
            checks.append(res)
    except MissingData as exc:
        return {"verdict": "not run", "measured": {"checks": []}, "missing": str(exc),
                "missing_select": getattr(exc, "select", {})}
    verdict = verdict_from([c["outcome"] for c in checks if not c["informational"]], rule.get("expect", "all"))
    return {"verdict": verdict, "measured": {"checks": checks}}


def _override_rule(rule: Any, override: dict[str, Any]) -> Any:
    if isinstance(rule, list):
        return [_override_rule(r, override) for r in rule]
    if not isinstance(rule, dict):
        return rule
    out = {k: _override_rule(v, override) for k, v in rule.items()}
    if "select" in out:
        out["select"] = {k: override.get(k, v) for k, v in out["select"].items()}
    return out


def rule_text(claim: dict[str, Any]) -> str:
    """Human-readable rule: the statement plus every check."""
    rule = claim["rule"]
    expect = rule.get("expect", "all")
    head = "reproduced iff every check holds for every seed" if expect == "all" else (
        "reproduced iff at least one check holds and at least one fails (the paper's effect is mixed)"
    )
    checks = "; ".join(
        ("(info) " if c.get("informational") else "") + _qtext(c["lhs"]) + f" {c.get('op', '>=')} "
        f"{float(c.get('factor', 1)):g} x " + _qtext(c.get("rhs", {"const": 1.0}))
        + (f" (both sides floored at {float(c['floor']):g})" if "floor" in c else "") for c in expand_checks(rule["checks"])
    )
    return f"{rule.get('statement', '')} [{head}: {checks}]".strip()


def claim_record(claim: dict[str, Any], experiment: str, result: dict[str, Any], *,
                 excluded_models: tuple[str, ...] = (), scale: str = "") -> dict[str, Any]:
    """The claims.json object of one claim. ``excluded_models``: models the run's scale
    leaves out (``exclude_models``), so a claim that needs one says so plainly."""
    rec = {
        "id": claim["id"],
        "effect": claim["effect"],
        "paper_effect": claim.get("paper_effect", ""),
        "where": claim.get("where", ""),
        "measured_quantity": claim.get("measured_quantity", ""),
        "verdict": result["verdict"],
        "measured": result["measured"],
        "rule": rule_text(claim),
        "experiment": experiment,
        "comparison": claim.get("comparison", ""),
        "plot": claim.get("plot", ""),
        "notes": claim.get("notes", "").strip(),
        "nearby": [],
    }
    if "missing" in result:
        model = result.get("missing_select", {}).get("model")
        if model in excluded_models:
            why = (f"Not run: the rule needs model {model}, which --scale {scale} excludes to stay fast; "
                   f"run `rankcollapse reproduce {experiment} --scale quick` to decide this claim.")
        else:
            why = "Not run: the run has no rows the rule needs (" + result["missing"] + ")."
        rec["notes"] = (rec["notes"] + " " + why).strip()
    return rec


def fmt(x: float) -> str:
    """Compact number for tables: 3 significant digits."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return str(x)
    return f"{x:.3g}"
