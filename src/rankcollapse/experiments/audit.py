"""What every verdict of a finished run rests on, read from its committed outputs
(``rankcollapse reproduce audit``, the report's "Robustness" section; docs/reproduce.md,
"Audit"): per claim the factor contrast, each threshold's band and flips, each check's
power and near-threshold control, and the bounds and near-floor sides. Nothing is
recomputed; a ``claims.json`` without bands is decided again from its checks
(:func:`redecide`).
"""

from __future__ import annotations

import json
import math
from contextlib import suppress
from pathlib import Path
from typing import Any

import pandas as pd

from .._io import read_as, read_user_json
from ..errors import ConfigError
from . import claims as C
from .axis import claims_with_axes
from .config import EXPERIMENTS, load_config
from .controls import NOT_ASSESSED, assess
from .quantities import EvalContext, MissingData
from .table import normalise

#: A side of a comparison whose mean is within this factor of its floor is flagged.
NEAR_FLOOR = 100.0


def redecide(rec: dict[str, Any], claim: dict[str, Any], table: pd.DataFrame | None = None,
             n_tokens: int | None = None) -> dict[str, Any]:
    """``rec`` (a stored claim record) decided again from its stored checks with ``claim``'s
    bands and factor; a factor-off arm is read from ``table`` where it has the rows."""
    if rec.get("verdict") == "not run" or not rec.get("checks"):
        return rec
    specs = C.expand_checks(claim["rule"]["checks"])
    checks = [dict(k) for k in rec["checks"]]
    if len(specs) != len(checks):
        return rec  # the stored checks are not this rule's
    checks = [C.annotate(k, s) if not k.get("informational") else k for k, s in zip(checks, specs)]
    if claim.get("factor"):
        checks = _with_factor_off(checks, claim, table, rec, n_tokens)
    checks = [{**k, "outcome": C.outcome_at(k)} if not k.get("informational") else k for k in checks]
    expect = claim["rule"].get("expect", "all")
    scored = C.scored_checks(checks)
    verdict = C.verdict_from([k["outcome"] for k in scored], expect)
    key = C.decisive(scored, verdict)
    res = C.with_bands({"verdict": verdict, "checks": checks}, expect)
    out = {**rec, "checks": checks, "verdict": verdict, "measured": key["value"], "interval": key["interval"],
           "bound": key.get("bound"), "decisive": key["check"], "verdict_at_threshold": res.get("verdict_at_threshold"),
           "factor": (claim.get("factor") or {}).get("name"), "bands": res["bands"]}
    deep = (rec.get("depth_check") or {}).get("verdict")
    # a record written before "not reproduced where decidable" existed called it mixed
    same = {C.registered_verdict(res)} | ({"mixed"} if C.registered_verdict(res) == C.NOT_WHERE_DECIDABLE else set())
    depth_sensitive = deep and deep not in (C.UNDECIDABLE, "not run") and deep not in same
    out["verdict"] = "mixed (depth-sensitive)" if depth_sensitive else res["verdict"]
    return out


def _with_factor_off(checks: list[dict[str, Any]], claim: dict[str, Any], table: pd.DataFrame | None,
                     rec: dict[str, Any], n_tokens: int | None = None) -> list[dict[str, Any]]:
    """Each scored check with its factor-off arm, from ``table`` or else a stored check of that text."""
    rule = claim["rule"]
    on_specs = C.expand_checks(rule["checks"])
    off_specs = C.factor_off_rule(rule, claim["factor"])["checks"]
    by_text = {k.get("text"): k for k in rec["checks"]}
    seed = sum(map(ord, str(claim.get("id", ""))))
    out = []
    for k, on, off in zip(checks, on_specs, off_specs):
        if k.get("informational") or off == on or k.get("factor_off") or k.get("outcome") == "missing":
            out.append(k)
            continue
        arm = None
        if table is not None:
            with suppress(MissingData):
                arm = C.evaluate_check(table, off, claim.get("setting", "default"),
                                       EvalContext(depth=rec.get("depth"), seed=seed, n_tokens=n_tokens))
        arm = arm or by_text.get(C.check_text(off))
        out.append({**k, "factor_off": {"text": C.check_text(off), "missing": "no rows and no stored check"} if arm is None
                    else {f: arm.get(f) for f in ("text", "value", "interval", "bound", "outcome")}})
    return out


def run_rules(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The claims a run stored in its ``config.json`` by id (axis claims included), with
    today's decision entries (:func:`with_decision_entries`)."""
    cfgs = list(config["configs"])
    cfgs += [load_config(n) for c in config["configs"] for n in c.get("claims_from", [])]
    today = {c["id"]: c for n in EXPERIMENTS for c in load_config(n).get("claims", [])}
    rules: dict[str, dict[str, Any]] = {}
    for cfg in cfgs:
        for claim in claims_with_axes(cfg, config["scale"]):
            rules.setdefault(claim["id"], with_decision_entries(claim, today.get(claim["id"].split(".")[0])))
    return rules


def _without_bands(rule: dict[str, Any]) -> str:
    return json.dumps({**rule, "checks": [{k: v for k, v in c.items() if k != "band"} for c in rule["checks"]]},
                      sort_keys=True, default=str)


def with_decision_entries(claim: dict[str, Any], today: dict[str, Any] | None) -> dict[str, Any]:
    """``claim`` with ``today``'s ``factor`` and check ``band`` entries; a claim amended
    since the run (an ``original`` block and another rule) is today's."""
    if not today:
        return claim
    if today.get("original") and claim["id"] == today["id"] and (
            _without_bands(json.loads(json.dumps(today["rule"]))) != _without_bands(claim["rule"])):
        return json.loads(json.dumps(today))
    bands = {c.get("name"): c["band"] for c in today["rule"]["checks"] if c.get("band") is not None}
    checks = [{**c, "band": bands[c.get("name")]} if c.get("name") in bands else c for c in claim["rule"]["checks"]]
    out = {**claim, "rule": {**claim["rule"], "checks": checks}}
    if today.get("factor"):
        out["factor"] = today["factor"]
    return out


def read_run(folder: str | Path, *, need_table: bool = False
             ) -> tuple[list[dict[str, Any]], dict[str, Any], pd.DataFrame | None]:
    """A finished run's claims, config and table (None without ``table.parquet``); :class:`ConfigError` for a
    folder that is not a finished run (naming the missing file), or a file in it that is not what a run writes."""
    folder = Path(folder)
    for name in ("config.json", "claims.json", "table.parquet" if need_table else "COMPLETE"):
        if not (folder / name).is_file():
            raise ConfigError(f"{str(folder)!r} is not a finished run folder: no {name} in it")
    config = read_user_json(folder / "config.json", "run config", ConfigError)
    claims = read_user_json(folder / "claims.json", "claims file", ConfigError)
    if not (isinstance(config, dict) and isinstance(config.get("configs"), list) and "scale" in config
            and all(isinstance(c, dict) for c in config["configs"])):
        raise ConfigError(f"{str(folder / 'config.json')!r} is not the config.json of a run: expected an object "
                          "with 'configs' (a list of objects) and 'scale'")
    if not (isinstance(claims, list) and all(isinstance(c, dict) and isinstance(c.get("id"), str) and "verdict" in c
                                             for c in claims)):
        raise ConfigError(f"{str(folder / 'claims.json')!r} is not the claims.json of a run: expected a list of "
                          "objects with 'id' and 'verdict'")
    if not (folder / "table.parquet").is_file():
        return claims, config, None
    try:
        return claims, config, normalise(pd.read_parquet(folder / "table.parquet"))
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"{str(folder / 'table.parquet')!r} is not a readable table of a run: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None


def audit_run(folder: str | Path) -> list[dict[str, Any]]:
    """One :func:`robustness` entry per claim of the run in ``folder`` (refusals as :func:`read_run`)."""
    claims, config, table = read_run(folder)
    with read_as(Path(folder) / "claims.json", "claims file"):  # with its config.json
        rules = run_rules(config)
        n_tokens, out = (config.get("data") or {}).get("n_tokens"), []
        for rec in claims:
            now = rec if "bands" in rec or rec["id"] not in rules else redecide(rec, rules[rec["id"]], table, n_tokens)
            out.append({**robustness(now), "stored_verdict": rec["verdict"]})
    return out


def robustness(rec: dict[str, Any]) -> dict[str, Any]:
    """The robustness entry of one claim record."""
    scored = C.scored_checks(rec.get("checks", []))
    contrast = [{"check": k["check"], "on": [k.get("value"), k.get("interval")], "outcome": k["outcome"],
                 "off": [k["factor_off"].get("value"), k["factor_off"].get("interval")] if "interval" in k["factor_off"] else None,
                 "off_outcome": k["factor_off"].get("outcome", k["factor_off"].get("missing"))}
                for k in scored if k.get("factor_off")]
    bounds = []
    for k in scored:
        floors = [f or 0.0 for f in (k.get("floors") or [0.0, 0.0])]
        sides = [k.get("lhs") or {}, k.get("rhs") or {}]
        near = [f"{name} {C.fmt(s.get('mean'))} within {NEAR_FLOOR:g} x its floor {C.fmt(f)} ({s.get('dtype')})"
                for name, s, f in zip(("lhs", "rhs"), sides, floors)
                if f and s.get("mean") is not None and math.isfinite(s["mean"]) and f < s["mean"] <= NEAR_FLOOR * f]
        if k.get("bound") or near:
            used = [f"{name} floor {C.fmt(f)} ({s.get('dtype')})" for name, s, f in zip(("lhs", "rhs"), sides, floors) if f]
            bounds.append({"check": k["check"], "bound": k.get("bound"), "number": C.fmt_measured(
                k.get("value"), k.get("interval"), k.get("bound"), k.get("decidable_to_layer")),
                "floors": floors, "floors_used": used, "near_floor": near})
    if "power" not in rec:  # a claims.json written before power was recorded
        rec = assess(rec, "mixed" if "at least one check holds and at least one fails" in str(rec.get("rule")) else "all")
    return {"id": rec["id"], "verdict": rec["verdict"],
            "verdict_at_threshold": rec.get("verdict_at_threshold") or C.registered_verdict(rec),
            "number": C.fmt_measured(rec.get("measured"), rec.get("interval"), rec.get("bound"),
                                     rec.get("decidable_to_layer")) if rec.get("measured") is not None else "—",
            "decisive": rec.get("decisive", ""), "factor": rec.get("factor"), "contrast": contrast,
            "bands": rec.get("bands", []), "bounds": bounds, "power": rec.get("power", []),
            "near_threshold": rec.get("near_threshold", []), "power_ok": rec.get("power_ok"),
            "nulls": [{"check": k["check"], "null": k["null_hypothesis"]} for k in scored if k.get("null_hypothesis")]}


def band_line(b: dict[str, Any]) -> str:
    """One threshold's band in words."""
    if b.get("band") is None:
        return f"{b['threshold']}: registered {C.fmt(b['registered'])}, no band (the no-effect value)"
    lo, hi = b["band"]
    flips = ", ".join(f"{f['at']:.4g} ({f['below']} below, {f['above']} above)" for f in b.get("flips", []))
    return (f"{b['threshold']}: registered {C.fmt(b['registered'])}, band {C.fmt(lo)} to {C.fmt(hi)}"
            f"{' (stated)' if b.get('stated') else ''}: {b.get('verdict_low')} at {C.fmt(lo)}, "
            f"{b.get('verdict_high')} at {C.fmt(hi)}; " + (f"flips at {flips}" if flips else "no flip"))


def contrast_line(entry: dict[str, Any], c: dict[str, Any]) -> str:
    """``factor: check: on x [lo, hi], off y [lo, hi] → outcome``."""
    on = f"{C.fmt(c['on'][0])} {C.fmt_interval(c['on'][1])}"
    off = f"{C.fmt(c['off'][0])} {C.fmt_interval(c['off'][1])}" if c["off"] else f"not run ({c['off_outcome']})"
    return f"{entry['factor']}: {c['check']}: on {on}, off {off} → {c['outcome']}"


def bound_line(b: dict[str, Any]) -> str:
    """A check whose number is a bound, or with a side near its floor."""
    head = f"bound: {b['check']}: {b['number']}" if b["bound"] else f"{b['check']}"
    used = f" ({', '.join(b.get('floors_used', []))})" if b["bound"] and b.get("floors_used") else ""
    return head + used + "".join(f"; {n}" for n in b["near_floor"])


def power_line(p: dict[str, Any]) -> str:
    """One check's power in words."""
    lo, hi = p["noise"]
    if p["pass_at"] is None:
        return f"{p['check']}: {p['reading']} (noise -{C.fmt(lo)} / +{C.fmt(hi)})"
    return (f"{p['check']}: {p['reading']} (noise -{C.fmt(lo)} / +{C.fmt(hi)}; with the truth at "
            f"{C.fmt(p['pass_at'])} it {'holds' if p['holds_there'] else 'does not hold'}, at "
            f"{C.fmt(p['fail_at'])} it {'fails' if p['fails_there'] else 'does not fail'})")


def near_line(n: dict[str, Any]) -> str:
    """One threshold's near-threshold control in words."""
    return (f"{n['threshold']} ({n['op']} {C.fmt(n['registered'])}): just inside {n['just_inside']:.7g} → "
            f"{n['outcome_inside']} ({n['verdict_inside']}), just outside {n['just_outside']:.7g} → "
            f"{n['outcome_outside']} ({n['verdict_outside']}){'' if n['ok'] else ': NOT AS IT MUST'}")


def power_text(e: dict[str, Any]) -> str:
    """The robustness table's power cell: ``ok`` or the checks that cannot pass or fail."""
    bad = [f"{p['check']}: {p['reading']}" for p in e.get("power", []) if p["reading"] not in ("can pass and fail", NOT_ASSESSED)]
    bad += [f"{n['threshold']}: near-threshold control fails" for n in e.get("near_threshold", []) if not n["ok"]]
    if not e.get("power") and not e.get("near_threshold"):
        return "—"
    return "; ".join(bad) or "ok"


def sensitivity_text(bands: list[dict[str, Any]]) -> str:
    """The sensitive thresholds: ``T (registered 0.99, band 0.98 to 0.995): reproduced below 0.9875, mixed above``."""
    parts = []  # flip points with 4 digits: two interval ends can share their first 3
    for b in bands:
        if not b.get("sensitive"):
            continue
        flips = "; ".join(f"{f['below']} below {f['at']:.4g}, {f['above']} above" for f in b.get("flips", [])) or (
            f"{b.get('verdict_low')} at {C.fmt(b['band'][0])}, {b.get('verdict_high')} at {C.fmt(b['band'][1])}")
        parts.append(f"{b['threshold']} (registered {C.fmt(b['registered'])}, band {C.fmt(b['band'][0])} to "
                     f"{C.fmt(b['band'][1])}): {flips}")
    return " | ".join(parts)


def audit_markdown(entries: list[dict[str, Any]], *, heading: str = "#") -> str:
    """The robustness table and, per claim, its factor contrast, bands and bounds."""
    lines = ["| id | verdict | at the registered thresholds | threshold flips inside the band | "
             "factor-off also passes | bounds / near floor | power and near-threshold controls |",
             "|---|---|---|---|---|---|---|"]
    for e in entries:
        flips = sensitivity_text(e["bands"]) or "none"
        off = sum(c["outcome"] == C.FACTOR_OFF_PASSES for c in e["contrast"])
        off_text = f"{off} of {len(e['contrast'])} checks ({e['factor']})" if e["contrast"] else "— (no factor named)"
        bounds = f"{sum(bool(b['bound']) for b in e['bounds'])} bounds, {sum(bool(b['near_floor']) for b in e['bounds'])} near floor"
        cells = [e["id"], e["verdict"], e["verdict_at_threshold"], flips, off_text, bounds, power_text(e)]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    for e in entries:
        lines += [f"{heading}## {e['id']}: {e['verdict']}", "", f"- decisive: {e['decisive']}: {e['number']}"]
        if e.get("stored_verdict") and e["stored_verdict"] != e["verdict"]:
            lines.append(f"- verdict stored in claims.json: {e['stored_verdict']}")
        lines += [f"- factor {contrast_line(e, c)}" for c in e["contrast"]]
        lines += [f"- threshold {band_line(b)}" for b in e["bands"]]
        lines += [f"- {bound_line(b)}" for b in e["bounds"]]
        lines += [f"- null of {n['check']}: {n['null']}" for n in e.get("nulls", [])]
        lines += [f"- power: {power_line(p)}" for p in e.get("power", [])]
        lines += [f"- near threshold: {near_line(n)}" for n in e.get("near_threshold", [])]
        lines.append("")
    return "\n".join(lines)
