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
"""

from __future__ import annotations

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
                      n_boot: int | None = None, setting: str = "default") -> dict[str, Any] | None:
    """Verdicts of ``claim``'s positive and negative controls on ``table`` at the claim
    depth, on the rows of ``setting`` (a claim axis's, :mod:`.axis`, or the default):
    ``{positive: {...}, negative: {...}, ok}`` where each entry holds ``why``,
    ``expected``, ``verdict``, ``passed``, ``measured``, ``interval`` and the checks;
    ``ok`` is True when both read as expected, None when either did not run (its rows
    are not in this run). None for a claim without controls."""
    from .claims import _evaluate_rule

    spec = claim.get("controls")
    if not spec:
        return None
    seed = sum(map(ord, str(claim.get("id", ""))))
    out: dict[str, Any] = {}
    for kind, expected in EXPECTED.items():
        control = spec[kind]
        ctx = EvalContext(depth=depth, seed=seed, **({"n_boot": n_boot} if n_boot else {}))
        res = _evaluate_rule(table, control_rule(claim["rule"], control), setting, ctx)
        out[kind] = {"why": " ".join(str(control.get("why", "")).split()), "expected": expected,
                     "verdict": res["verdict"], "passed": res["verdict"] in PASSING[kind], "measured": res["measured"],
                     "interval": res["interval"], "bound": res.get("bound"), "decisive": res.get("decisive", ""),
                     "checks": res["checks"], **({"missing": res["missing"]} if "missing" in res else {})}
    ran = all(out[k]["verdict"] != "not run" for k in EXPECTED)
    out["ok"] = all(out[k]["passed"] for k in EXPECTED) if ran else None
    return out
