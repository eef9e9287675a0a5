"""Rule transforms (docs/reproduce.md, "Claims"): ``for_each`` loops unrolled
(:func:`expand_checks`), quantities edited by a control or a claim's factor
(:func:`edit_rule`, :mod:`.controls`), selections moved to a nearby setting
(:func:`_override_rule`).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from ..errors import ConfigError
from .config import window_spec


def expand_checks(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Unroll ``for_each`` templates: one copy per value, ``"{key}"`` strings filled in."""
    out = []
    for c in checks:
        loops = c.get("for_each")
        if not loops:
            out.append(c)
            continue
        keys = list(loops)
        for combo in itertools.product(*(loops[k] for k in keys)):
            sub = dict(zip(keys, combo))
            body = _fill({k: v for k, v in c.items() if k != "for_each"}, sub)
            body["name"] = f"{c.get('name', 'check')} [{', '.join(f'{k}={v}' for k, v in sub.items())}]"
            out.append(body)
    return out


def _fill(obj: Any, sub: dict[str, Any]) -> Any:
    if isinstance(obj, dict):
        return {k: _fill(v, sub) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, sub) for v in obj]
    if isinstance(obj, str) and obj.startswith("{") and obj.endswith("}") and obj[1:-1] in sub:
        return sub[obj[1:-1]]
    return obj


def _matches(q: dict[str, Any], where: dict[str, Any]) -> bool:
    sel = q.get("select", {})
    for k, want in where.items():
        have = q.get("metric") if k == "metric" else sel.get(k)
        if have is None or str(have) != str(want):
            return False
    return True


def _edit(q: dict[str, Any], edit: dict[str, Any]) -> dict[str, Any]:
    if q.get("stat") in ("ratio", "difference"):
        return {**q, "num": _edit(q["num"], edit), "den": _edit(q["den"], edit)}
    if "const" in q or not _matches(q, edit.get("where", {})):
        return q
    q = copy.deepcopy(q)
    sel = q.setdefault("select", {})
    for col, mapping in edit.get("replace", {}).items():
        if col in sel and str(sel[col]) in {str(k) for k in mapping}:
            sel[col] = next(v for k, v in mapping.items() if str(k) == str(sel[col]))
    sel.update(edit.get("set", {}))
    for col in edit.get("drop", []):
        sel.pop(col, None)
    q.update(edit.get("quantity", {}))
    return q


def edit_rule(rule: dict[str, Any], edits: list[dict[str, Any]]) -> dict[str, Any]:
    """``rule`` with every check's quantities edited by ``edits`` (:mod:`.controls`), loops unrolled first;
    :class:`ConfigError` for an edit with an unknown key or side."""
    checks = expand_checks(rule["checks"])
    for edit in edits:
        bad = set(edit) - {"where", "side", "replace", "set", "drop", "quantity"}
        if bad:
            raise ConfigError(f"control edit: unknown keys {sorted(bad)}")
        side = edit.get("side", "both")
        if side not in ("lhs", "rhs", "both"):
            raise ConfigError(f"control edit: side must be lhs, rhs or both, got {side!r}")
        sides = ("lhs", "rhs") if side == "both" else (side,)
        checks = [{**c, **{s: _edit(c[s], edit) for s in sides if s in c}} for c in checks]
    return {**rule, "checks": checks}


def factor_off_rule(rule: dict[str, Any], factor: dict[str, Any]) -> dict[str, Any]:
    """``rule`` with the claim's factor switched off (the edits ``factor["without"]``)."""
    return edit_rule(rule, factor["without"])


def _override_rule(rule: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """The rule a nearby setting reads: loops unrolled, then every selected value the override changes replaced."""
    if not override:
        return rule
    checks = [{**c, "for_each": {k: [window_spec(v, override) for v in vs] for k, vs in c["for_each"].items()}}
              if c.get("for_each") else c for c in rule["checks"]]
    return {**rule, "checks": _override_selects(expand_checks(checks), override)}


def _override_selects(rule: Any, override: dict[str, Any]) -> Any:
    if isinstance(rule, list):
        return [_override_selects(r, override) for r in rule]
    if not isinstance(rule, dict):
        return rule
    out = {k: _override_selects(v, override) for k, v in rule.items()}
    if "select" in out:
        sel = {k: override.get(k, v) for k, v in out["select"].items()}
        if "mask_spec" in sel:
            sel["mask_spec"] = window_spec(sel["mask_spec"], override)
        out["select"] = sel
    return out
