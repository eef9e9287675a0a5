"""Normalisation claims of a phase table (Karagodin et al., NeurIPS 2025): the speed law
(:func:`speed_law`) and the ordering (:func:`ordering`), with :func:`controls`; the rules are
in docs/phase.md, "Normalisations as speed regulators".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..metrics.floor import mu_floor
from .grid import AXES
from .regime import RATE_FLOOR, law_measures

#: norms that normalise (dyt is elementwise tanh: no normalisation, reported, not in scope)
NORMALISING = ("sphere", "layernorm", "rmsnorm")
#: the band of exponents read as "about t^-2" (fixed before the sweep)
EXPONENT_BAND = (-2.5, -1.5)
#: The paper's stated assumptions (full attention, one set of weights for all layers) as
#: cell filters: a statement about the paper is decided on these cells only.
PAPER_SETTING = {"mask": "complete", "shared": True}
#: The identity-weights positive control of the law fit (:func:`identity_control`).
IDENTITY_CONTROL = {"n_tokens": 8, "d_model": 16, "depth": 64, "rho": (0.1, 0.5)}
PREDICTED_ABOVE_POST_LN = ("pre_ln", "peri", "mix", "lns", "ngpt")
#: :func:`bounded_median`'s columns without a pair
NO_PAIRS = {"median_dlog10_mu": float("nan"), "median_bound": None, "median_text": "no pairs"}


def wilson(hits: int, n: int) -> tuple[float, float]:
    """Wilson 95% interval of ``hits / n`` (scipy's ``binomtest``); NaN, NaN when ``n = 0``."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(hits), int(n)).proportion_ci(0.95, method="wilson")
    return float(ci.low), float(ci.high)


def _side(lo: float, hi: float) -> str:
    """``above`` / ``below`` 1/2 when the interval excludes it, else ``undecided``."""
    return "above" if lo > 0.5 else ("below" if hi < 0.5 else "undecided")


def law_verdict(cells: pd.DataFrame, law: str) -> dict[str, Any]:
    """Of ``cells`` with a decided law, the fraction whose law is ``law`` with its Wilson
    interval; ``verdict`` ``law`` (above 1/2), ``not_<law>`` (below) or ``undecided``."""
    decided = cells[cells["law"] != "undecided"]
    hits = int((decided["law"] == law).sum())
    lo, hi = wilson(hits, len(decided))
    side = _side(lo, hi)
    return {"cells": int(len(cells)), "decided": int(len(decided)), law: hits,
            "fraction": hits / len(decided) if len(decided) else float("nan"), "ci": [lo, hi],
            "by_law": cells["law"].value_counts().to_dict(),
            "verdict": law if side == "above" else (f"not_{law}" if side == "below" else "undecided")}


def exponent_verdict(cells: pd.DataFrame, seed: int = 0) -> dict[str, Any]:
    """Median ``law_exponent`` of the power-law ``cells`` with its 95% percentile bootstrap
    interval; ``verdict`` ``consistent`` when it meets :data:`EXPONENT_BAND` (under 2 cells
    ``undecided``)."""
    from scipy.stats import bootstrap

    p = cells.loc[cells["law"] == "power", "law_exponent"].dropna().to_numpy()
    if p.size < 2:
        return {"cells": int(p.size), "median": float(np.median(p)) if p.size else float("nan"),
                "ci": [float("nan")] * 2, "verdict": "undecided"}
    ci = bootstrap((p,), np.median, n_resamples=2000, method="percentile",
                   random_state=np.random.default_rng(seed)).confidence_interval
    meets = ci.low <= EXPONENT_BAND[1] and ci.high >= EXPONENT_BAND[0]
    return {"cells": int(p.size), "median": float(np.median(p)), "ci": [float(ci.low), float(ci.high)],
            "band": list(EXPONENT_BAND), "verdict": "consistent" if meets else "inconsistent"}


def _scope(table: pd.DataFrame) -> pd.DataFrame:
    """Softmax cells with a normalising norm, ``qk_scale > 0`` and ``value_scale > 0``."""
    keep = table["norm"].isin(NORMALISING) & (table["qk_scale"] > 0) & (table["value_scale"] > 0)
    return table[keep & (table["attention"] == "softmax")]


def paper_setting(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells of ``cells`` that match :data:`PAPER_SETTING` (none when a column is missing)."""
    keep = pd.Series(True, index=cells.index)
    for axis, value in PAPER_SETTING.items():
        if axis not in cells:
            return cells.iloc[:0]
        keep &= cells[axis].astype(type(value)) == value
    return cells[keep]


def speed_law(table: pd.DataFrame) -> dict[str, Any]:
    """The speed-law claim on ``table``: the law per placement on the pooled scope and on
    :data:`PAPER_SETTING`; the ``t^-2`` exponent on :data:`PAPER_SETTING`, the pooled
    median apart."""
    cells = _scope(table)
    pooled = _laws(cells)
    by_qk = {f"qk_norm={bool(k)}": {p: law_verdict(g[g["placement"] == p], law)["by_law"]
                                    for p, law in (("post_ln", "exponential"), ("pre_ln", "power"))}
             for k, g in cells.groupby("qk_norm")} if "qk_norm" in cells else {}
    pre_cells = cells[cells["placement"] == "pre_ln"]
    exponent = {k: v for k, v in exponent_verdict(pre_cells).items() if k != "verdict"}
    return {"post_ln": pooled["post_ln"], "pre_ln": pooled["pre_ln"],
            "pre_ln_exponent": {**exponent_verdict(paper_setting(pre_cells)), "setting": dict(PAPER_SETTING)},
            "paper_setting": {"setting": dict(PAPER_SETTING), **_laws(paper_setting(cells))},
            "pre_ln_exponent_pooled": {**exponent, "setting": "every scope cell (all masks, fresh and shared weights): "
                                                              "a description of the sweep, not a test of the paper"},
            "by_qk_norm": by_qk, "verdict": pooled["verdict"]}


def _laws(cells: pd.DataFrame) -> dict[str, Any]:
    """The law verdicts of the post-LN (exponential) and pre-LN (power) ``cells`` and the claim's ``verdict``."""
    post = law_verdict(cells[cells["placement"] == "post_ln"], "exponential")
    pre = law_verdict(cells[cells["placement"] == "pre_ln"], "power")
    holds = post["verdict"] == "exponential" and pre["verdict"] == "power"
    failed = post["verdict"] == "not_exponential" or pre["verdict"] == "not_power"
    return {"post_ln": post, "pre_ln": pre, "verdict": "holds" if holds else ("fails" if failed else "undecided")}


def paired(table: pd.DataFrame, axis: str, value: Any, base: Any) -> pd.DataFrame:
    """Cells with ``axis == value`` joined to the cell with ``axis == base`` equal in every
    other axis; column ``dlog10_mu`` = log10 mu_relative (value minus base)."""
    axes = [a for a in AXES if a in table and a != axis]
    left = table[table[axis] == base].set_index(axes)["mu_relative"]
    right = table[table[axis] == value].set_index(axes)["mu_relative"]
    joined = pd.concat({"mu": right, "mu_base": left}, axis=1, join="inner")
    joined["dlog10_mu"] = np.log10(joined["mu"].clip(lower=1e-300)) - np.log10(joined["mu_base"].clip(lower=1e-300))
    return joined.reset_index()


def cell_floor(pairs: pd.DataFrame) -> pd.Series:
    """Per row, :func:`rankcollapse.metrics.floor.mu_floor` at its N and d (the grid's defaults
    where a column is missing)."""
    n = pairs["n_tokens"] if "n_tokens" in pairs else pd.Series(AXES["n_tokens"][1], index=pairs.index)
    d = pairs["d_model"] if "d_model" in pairs else pd.Series(AXES["d_model"][1], index=pairs.index)
    return pd.Series([mu_floor(int(a), int(b)) for a, b in zip(n, d)], index=pairs.index, dtype=np.float64)


def bounded_median(side: pd.Series, base: pd.Series, floor: pd.Series) -> dict[str, Any]:
    """Median over pairs of ``log10 side - log10 base`` (``mu_relative``), a measurement or a
    bound: a value within its ``floor`` is read there, so a pair with ``base`` (``side``) there
    reads a lower (upper) bound, with both it is left out; ``median_bound`` is ``lower`` /
    ``upper`` when such a pair sits at or below / above the median, ``undecidable`` when both."""
    low, up = base <= floor, side <= floor
    diff = np.log10(np.maximum(side, floor)) - np.log10(np.maximum(base, floor))
    keep = ~(low & up)
    v = diff[keep]
    if not len(v):
        return {"median_dlog10_mu": float("nan"), "median_bound": "undecidable", "median_text": "undecidable",
                "pairs_base_at_floor": 0, "pairs_side_at_floor": 0}
    m = float(v.median())
    lower = bool((low & ~up & (diff <= m))[keep].any())
    upper = bool((up & ~low & (diff >= m))[keep].any())
    bound = "undecidable" if lower and upper else ("lower" if lower else ("upper" if upper else None))
    text = {"lower": f"≥ {m:.3g}", "upper": f"≤ {m:.3g}", "undecidable": "undecidable", None: f"{m:.3g}"}[bound]
    return {"median_dlog10_mu": m, "median_bound": bound, "median_text": text,
            "pairs_base_at_floor": int((low & ~up).sum()), "pairs_side_at_floor": int((up & ~low).sum())}


def above_verdict(pairs: pd.DataFrame) -> dict[str, Any]:
    """Sign rule on ``pairs`` (:func:`paired`), ties and pairs with both sides at or below
    ``RATE_FLOOR`` left out: the fraction above, its Wilson interval, ``verdict`` above /
    below / undecided, and the median gap (:func:`bounded_median`)."""
    at_floor = (pairs["mu"] <= RATE_FLOOR) & (pairs["mu_base"] <= RATE_FLOOR) if len(pairs) else pairs["dlog10_mu"] != 0
    untied = pairs[(pairs["dlog10_mu"] != 0) & ~at_floor]
    hits = int((untied["dlog10_mu"] > 0).sum())
    lo, hi = wilson(hits, len(untied))
    median = bounded_median(pairs["mu"], pairs["mu_base"], cell_floor(pairs)) if len(pairs) else NO_PAIRS
    return {"pairs": int(len(pairs)), "untied": int(len(untied)), "both_at_floor": int(at_floor.sum()),
            "above": hits, "ci": [lo, hi], **median, "verdict": _side(lo, hi)}


def ordering(table: pd.DataFrame) -> dict[str, Any]:
    """The ordering claim on ``table``, with the measured order (median log10 mu/||X||_F per
    placement over the sphere-norm cells, the one norm every placement runs with)."""
    cells = _scope(table)
    per = {p: above_verdict(paired(cells, "placement", p, "post_ln"))
           for p in PREDICTED_ABOVE_POST_LN if p in set(cells["placement"])}
    sides = [v["verdict"] for v in per.values()]
    sphere = cells[cells["norm"] == "sphere"]
    measured = (np.log10(sphere["mu_relative"].clip(lower=1e-300)).groupby(sphere["placement"]).median()
                .sort_values(ascending=False))
    floor = np.log10(cell_floor(sphere)).groupby(sphere["placement"]).max()
    text = {k: (f"≤ {floor[k]:.3g} (round-off)" if v <= floor[k] else f"{v:.3g}") for k, v in measured.items()}
    return {"predicted": "post_ln lowest: " + ", ".join(PREDICTED_ABOVE_POST_LN) + " each above post_ln",
            "vs_post_ln": per, "measured_order_sphere": {k: float(v) for k, v in measured.items()},
            "measured_order_sphere_text": text,
            "verdict": "holds" if sides and all(s == "above" for s in sides)
            else ("fails" if "below" in sides else "undecided")}


def identity_control() -> dict[str, Any]:
    """Positive control of the law fit in the paper's setting (:data:`IDENTITY_CONTROL`): ``n_tokens``
    unit tokens with pairwise cosine ``rho`` (``x_i = sqrt(rho) e_1 + sqrt(1 - rho) e_{i+1}``),
    ``W_Q = W_K = W_V = I``, full attention, sphere norm, float64; post-LN must read
    ``exponential``, pre-LN ``power`` in :data:`EXPONENT_BAND`."""
    import torch

    from ..dynamics.config import BlockConfig
    from ..dynamics import RunConfig, simulate

    n_tokens, d_model, depth = IDENTITY_CONTROL["n_tokens"], IDENTITY_CONTROL["d_model"], IDENTITY_CONTROL["depth"]
    runs, ok = [], True
    for rho in IDENTITY_CONTROL["rho"]:
        X = torch.zeros(1, n_tokens, d_model, dtype=torch.float64)
        X[0, :, 0] = rho ** 0.5
        X[0, torch.arange(n_tokens), torch.arange(n_tokens) + 1] = (1 - rho) ** 0.5
        for placement, law in (("post_ln", "exponential"), ("pre_ln", "power")):
            r = simulate(X, mask="complete", block=BlockConfig(norm="sphere", placement=placement),
                         value="identity", query_key="identity", shared=True, metrics=("avg_cos",),
                         run=RunConfig(depth=depth, dtype=torch.float64))
            fit = law_measures(r.metrics["avg_cos"].numpy().reshape(depth + 1, 1), n_tokens, d_model)[0]
            good = fit["law"] == law and (law != "power" or EXPONENT_BAND[0] <= fit["law_exponent"] <= EXPONENT_BAND[1])
            ok &= good
            runs.append({"placement": placement, "rho": rho, "expected": law, "law": fit["law"],
                         "law_exponent": fit["law_exponent"], "law_rate": fit["law_rate"], "passes": bool(good)})
    return {"setting": {"n_tokens": n_tokens, "d_model": d_model, "depth": depth, "mask": "complete",
                        "weights": "W_Q = W_K = W_V = I", "inputs": "equiangular"}, "runs": runs, "passes": bool(ok)}


def controls(table: pd.DataFrame) -> dict[str, Any]:
    """The two rules on the control cells of ``table`` (docs/phase.md) and whether each gave
    its known answer (``passes``), with :func:`identity_control`."""
    uniform = table[(table["qk_scale"] == 0) & (table["value"] == "orthogonal") & table["norm"].isin(NORMALISING)
                    & (table["value_scale"] > 0) & (table["attention"] == "softmax")]
    post = law_verdict(uniform[uniform["placement"] == "post_ln"], "exponential")
    pre_cells = paper_setting(uniform[uniform["placement"] == "pre_ln"])
    pre = law_verdict(pre_cells, "power")
    exponent = exponent_verdict(pre_cells)
    zero = table[(table["value_scale"] == 0) & table["norm"].isin(NORMALISING)]
    no_law = {p: law_verdict(zero[zero["placement"] == p], "exponential" if p == "post_ln" else "power")
              for p in ("post_ln", "pre_ln")}
    order_pos = above_verdict(paired(uniform, "placement", "pre_ln", "post_ln"))
    s0 = table[(table["qk_scale"] == 0) & table["norm"].isin(NORMALISING) & (table["value_scale"] > 0)]
    order_neg = above_verdict(paired(s0, "qk_norm", True, False)) if "qk_norm" in s0 else above_verdict(s0.iloc[:0])
    out = {
        "law_positive_post_ln_uniform": {**post, "passes": post["verdict"] == "exponential"},
        "law_positive_pre_ln_uniform_paper_setting": {**pre, "exponent": exponent,
                                              "passes": pre["verdict"] == "power" and exponent["verdict"] == "consistent"},
        "law_negative_zero_values": {p: {**v, "passes": v["decided"] == 0 and v["cells"] > 0} for p, v in no_law.items()},
        "ordering_positive_pre_over_post_uniform": {**order_pos, "passes": order_pos["verdict"] == "above"},
        "ordering_negative_qk_norm_at_s0": {**order_neg, "passes": order_neg["verdict"] == "undecided"
                                            and order_neg["pairs"] > 0},
        "law_positive_identity_weights": identity_control(),
    }
    out["all_pass"] = all(v["passes"] if "passes" in v else all(w["passes"] for w in v.values())
                          for v in out.values())
    return out


def law_table(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (placement, norm) over the softmax cells with ``qk_scale > 0`` and ``W_V != 0``: law
    counts and medians of the fit measures and of log10 mu/||X||_F."""
    cells = table[(table["qk_scale"] > 0) & (table["value_scale"] > 0) & (table["attention"] == "softmax")]
    cells = cells.assign(log10_mu=np.log10(cells["mu_relative"].clip(lower=1e-300)))
    rows = []
    for (p, n), g in cells.groupby(["placement", "norm"], sort=True):
        rows.append({"placement": p, "norm": n, "cells": int(len(g)),
                     **{f"n_{law}": int((g["law"] == law).sum()) for law in ("exponential", "power", "undecided")},
                     "median_exponent": float(g["law_exponent"].median()), "median_rate": float(g["law_rate"].median()),
                     "median_r2_exp": float(g["law_r2_exp"].median()),
                     "median_r2_power": float(g["law_r2_power"].median()),
                     "median_log10_mu": float(g["log10_mu"].median())})
    return rows


def normalisation_summary(table: pd.DataFrame) -> dict[str, Any]:
    """Both claims, their controls and the law table of a sweep (JSON-able)."""
    return {"cells": int(len(table)), "speed_law": speed_law(table), "ordering": ordering(table),
            "controls": controls(table), "law_table": law_table(table)}
