"""A claim's sequence-length axis: the same rule decided again at other window lengths N.

A claim may name an ``n_tokens_axis`` in its config::

    n_tokens_axis:
      n_tokens: [128, 1024, 8192]
      units: {kind: pretrained_sa, d_qk: [...]}   # the units the rule reads (controls too)
      params: {positions: none, depth: 1, ...}     # given to every axis unit
      max_windows: {8192: 4}                       # N -> windows a unit reads at most
      why: "..."

For each N the units that ``units`` selects are run again with ``n_tokens: N`` and
``params`` (:func:`axis_units`), under the setting label ``n_tokens=N,<params named in
LABEL_PARAMS>`` (e.g. ``n_tokens=1024,positions=none``); the rule and both controls are
then read on the rows of that setting only, as the claim ``<id>.N<N>``
(:func:`axis_claims`). The claim's own rows (setting ``default``) and verdict are
untouched: the axis adds rows and claims. A scale may cap the axis with
``max_axis_tokens`` (``smoke`` runs the short windows only).
"""

from __future__ import annotations

import copy
from typing import Any

from ..sweep.units import Unit
from .config import scale_settings, setting_label, unit_matches, with_override

#: Axis parameters that change the inputs and therefore name the setting (with ``n_tokens``).
LABEL_PARAMS = ("positions",)


def axis_values(claim: dict[str, Any], sc: dict[str, Any]) -> list[int]:
    """The window lengths N of ``claim``'s axis that the scale settings ``sc`` run
    (those <= ``max_axis_tokens`` when the scale names it); empty without an axis."""
    axis = claim.get("n_tokens_axis")
    if not axis:
        return []
    cap = sc.get("max_axis_tokens")
    return [int(n) for n in axis["n_tokens"] if cap is None or int(n) <= int(cap)]


def axis_label(axis: dict[str, Any], n_tokens: int) -> str:
    """Setting label of the axis at ``n_tokens``, e.g. ``n_tokens=1024,positions=none``."""
    params = axis.get("params", {})
    return setting_label({"n_tokens": int(n_tokens), **{k: params[k] for k in LABEL_PARAMS if k in params}})


def axis_id(claim_id: str, n_tokens: int) -> str:
    """``C06`` at N = 1024 -> ``C06.N1024``."""
    return f"{claim_id}.N{int(n_tokens)}"


def axis_units(cfg: dict[str, Any], units: list[Unit], scale: str) -> list[Unit]:
    """The units every claim axis of ``cfg`` adds to ``units`` (the config's expanded
    units) at ``scale``: each default-setting unit its ``units`` filter selects, with
    ``n_tokens``, the axis ``params`` and at most ``max_windows[N]`` windows (fewer when
    the unit has fewer), labelled with :func:`axis_label`.
    A unit two claims share (same parameters) appears once."""
    sc = scale_settings(cfg, scale)
    out: dict[str, Unit] = {}
    for claim in cfg.get("claims", []):
        axis = claim.get("n_tokens_axis")
        for n in axis_values(claim, sc):
            for u in units:
                if u.params.get("setting") != "default" or not unit_matches(u, axis.get("units", {})):
                    continue
                windows = int(u.params["n_samples"])
                cap = {int(k): int(v) for k, v in (axis.get("max_windows") or {}).items()}.get(int(n))
                if cap is not None:
                    windows = min(windows, cap)
                override = {"n_tokens": n, **axis.get("params", {}), "n_samples": windows}
                v = with_override(u, override, axis_label(axis, n))
                out.setdefault(v.hash, v)
    return list(out.values())


def axis_claims(cfg: dict[str, Any], scale: str) -> list[dict[str, Any]]:
    """The claims ``<id>.N<N>`` of every claim axis of ``cfg`` run at ``scale``: the
    claim's rule and controls unchanged, read under the axis setting (``setting``), with
    ``axis: {claim, n_tokens, setting, params, why}`` saying what was varied. No nearby
    settings and no amendment history (those belong to the claim itself); no figure (the
    claim's figure draws the default setting)."""
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
            c["id"] = axis_id(claim["id"], n)
            c["setting"] = label
            c["axis"] = {"claim": claim["id"], "n_tokens": n, "setting": label, "params": dict(axis.get("params", {})),
                         "why": " ".join(str(axis.get("why", "")).split())}
            c["comparison"] = f"{claim.get('comparison', '')} [N = {n} tokens; {label}]".strip()
            out.append(c)
    return out


def claims_with_axes(cfg: dict[str, Any], scale: str) -> list[dict[str, Any]]:
    """``cfg``'s claims followed by the claims of their axes at ``scale``."""
    return list(cfg.get("claims", [])) + axis_claims(cfg, scale)
