"""A claim's sequence-length axis: the same rule decided again at other window lengths N
(``n_tokens_axis`` in a claim's config: ``n_tokens``, ``units``, ``params``,
``max_windows``, ``why``; docs/reproduce.md). For each N the selected units run again
under the setting ``n_tokens=N,...`` (:func:`axis_units`) and the rule and controls are
read there as the claim ``<id>.N<N>`` (:func:`axis_claims`); a scale may cap N with
``max_axis_tokens``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from ..sweep.units import Unit
from .config import scale_settings, setting_label, unit_matches, with_override

#: Axis parameters that change the inputs and therefore name the setting (with ``n_tokens``).
LABEL_PARAMS = ("positions",)


def axis_values(claim: dict[str, Any], sc: dict[str, Any]) -> list[int]:
    """The window lengths N of ``claim``'s axis that the scale settings ``sc`` run."""
    axis = claim.get("n_tokens_axis")
    if not axis:
        return []
    cap = sc.get("max_axis_tokens")
    return [int(n) for n in axis["n_tokens"] if cap is None or int(n) <= int(cap)]


def axis_label(axis: dict[str, Any], n_tokens: int) -> str:
    """Setting label of the axis at ``n_tokens``, e.g. ``n_tokens=1024,positions=none``."""
    params = axis.get("params", {})
    return setting_label({"n_tokens": int(n_tokens), **{k: params[k] for k in LABEL_PARAMS if k in params}})


def axis_units(cfg: dict[str, Any], units: list[Unit], scale: str) -> list[Unit]:
    """The distinct units every claim axis of ``cfg`` adds to its expanded ``units`` at ``scale``."""
    sc = scale_settings(cfg, scale)
    out: dict[str, Unit] = {}
    for claim in cfg.get("claims", []):
        axis = claim.get("n_tokens_axis")
        for n in axis_values(claim, sc):
            cap = {int(k): int(v) for k, v in (axis.get("max_windows") or {}).items()}.get(int(n), math.inf)
            for u in units:
                if u.params.get("setting") != "default" or not unit_matches(u, axis.get("units", {})):
                    continue
                override = {"n_tokens": n, **axis.get("params", {}), "n_samples": min(int(u.params["n_samples"]), cap)}
                v = with_override(u, override, axis_label(axis, n))
                out.setdefault(v.hash, v)
    return list(out.values())


def axis_claims(cfg: dict[str, Any], scale: str) -> list[dict[str, Any]]:
    """The claims ``<id>.N<N>`` of every claim axis of ``cfg`` at ``scale``: rule and controls
    read under the axis ``setting``, ``axis`` saying what was varied (no nearby settings,
    history or figure)."""
    if scale not in cfg.get("scales", {}):
        return []
    sc = scale_settings(cfg, scale)
    out = []
    for claim in cfg.get("claims", []):
        axis = claim.get("n_tokens_axis")
        for n in axis_values(claim, sc):
            c = {k: copy.deepcopy(v) for k, v in claim.items()
                 if k not in ("n_tokens_axis", "nearby", "nearby_units", "original", "plot")}
            label = axis_label(axis, n)
            c["id"] = f"{claim['id']}.N{int(n)}"
            c["setting"] = label
            c["axis"] = {"claim": claim["id"], "n_tokens": n, "setting": label, "params": dict(axis.get("params", {})),
                         "why": " ".join(str(axis.get("why", "")).split())}
            c["comparison"] = f"{claim.get('comparison', '')} [N = {n} tokens; {label}]".strip()
            out.append(c)
    return out


def claims_with_axes(cfg: dict[str, Any], scale: str) -> list[dict[str, Any]]:
    """``cfg``'s claims followed by the claims of their axes at ``scale``."""
    return list(cfg.get("claims", [])) + axis_claims(cfg, scale)
