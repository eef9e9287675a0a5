"""Unit kinds of the temperature-law experiment (``configs/laws.yaml``; docs/phase.md,
"Temperature laws" and "Temperature against sequence length"; docs/reproduce.md).

``temperature_law``: the participation ratio of one law (``law``) at width ``d_model``
over key counts ``n_tokens`` (powers of ten), :func:`rankcollapse.theory.temperature.participation_scan`
(``keys``, ``query``, ``n_queries``, ``draw_seed``). Rows ``participation_ratio`` at
``layer = log10 N``, ``point = "n_tokens.N"``, per-query values.

``temperature_switch``: per N (powers of two) the switch ``x*`` of ``β = law:x`` over
``grid`` (:func:`rankcollapse.theory.critical.switch` of
:func:`~rankcollapse.theory.temperature.switch_ratios`, or the closed form for ``tokens:
exact``). Rows at ``layer = log2 N``: ``gamma_switch`` and ``gamma_distance``
``|x* - γ_c| / γ_c`` with ``γ_c = 1 / (1 - rho)``.

``gap_count``: the gap-counting fits (:func:`rankcollapse.metrics.attention.gap_growth`,
``k_max =`` :data:`GAP_K_MAX`) of a pretrained model's attention rows with more than
``k_max`` keys, block ``k`` at ``layer = k + 1``, beside Gaussian and uniform logits of
the same rows' variance (``variant`` ``model | gaussian | uniform``). Metrics per window:
``gap_r2_exp``, ``gap_r2_pow``, ``gap_fit_advantage`` (their difference), ``gap_rate``
(NaN for a row whose logits are equal to round-off) and ``gap_exponent``.

Labels: ``source`` the kind, ``mask = complete`` (``gap_count``: the model's own),
``dtype = float64`` (``gap_count``: float32).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .table import normalise, rows_from_metrics
from .units import _labels, _model_unit, register


def law_variant(law: str, d_model: int) -> str:
    """``variant`` of a unit: ``"pow:1.0,d=3"`` (the law's canonical spec)."""
    from ..dynamics.temperature_laws import parse_law

    return f"{parse_law(str(law)).spec},d={int(d_model)}"


def _decades(sizes: list[int], base: int = 10, kind: str = "temperature_law") -> list[int]:
    """``log_base N`` of each N, refusing an N that is not a power of ``base`` (at least ``base``)."""
    out = []
    for n in sizes:
        k = round(math.log(n, base)) if n > 0 else -1
        if k < 1 or base**k != n:
            raise ConfigError(f"{kind} n_tokens must be powers of {base} >= {base} (a layer is a factor {base}), got {n}")
        out.append(k)
    return out


def temperature_law_rows(p: dict[str, Any]) -> pd.DataFrame:
    """Rows of one ``temperature_law`` unit from its parameters."""
    from ..theory.temperature import participation_scan

    sizes = [int(n) for n in p["n_tokens"]]
    layers = _decades(sizes)
    scan = participation_scan([str(p["law"])], sizes, keys=str(p.get("keys", "sphere")), d_model=int(p["d_model"]),
                              n_queries=int(p["n_queries"]), query=str(p.get("query", "fresh")),
                              seed=int(p.get("draw_seed", 0)))
    spec = scan.config["laws"][0]
    values = np.stack([scan.per_query[(n, spec)] for n in sizes])  # (L, n_queries)
    return rows_from_metrics({"participation_ratio": values}, {}, layers=layers,
                             points=[f"n_tokens.{n}" for n in sizes])


def run_temperature_law(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``temperature_law`` unit kind."""
    p = unit.params
    labels = _labels(unit, model=str(p.get("keys", "sphere")), variant=law_variant(p["law"], p["d_model"]),
                     mask="complete", mask_spec="complete", dtype="float64")
    return normalise(temperature_law_rows(p), labels)


def temperature_switch_rows(p: dict[str, Any]) -> pd.DataFrame:
    """Rows of one ``temperature_switch`` unit from its parameters."""
    from ..dynamics.temperature_laws import parse_law
    from ..theory.critical import paper_gamma, switch
    from ..theory.temperature import simplex_switch_ratio, switch_ratios

    sizes = [int(n) for n in p["n_tokens"]]
    layers = _decades(sizes, 2, "temperature_switch")
    grid, law, d = [float(x) for x in p["grid"]], str(p.get("law", "log")), int(p.get("d_model", 64))
    rho, tokens = float(p.get("rho", 0.5)), str(p.get("tokens", "simplex"))
    gamma_c = paper_gamma(rho)
    found = []
    for N in sizes:
        betas = [parse_law(f"{law}:{x}").beta(N, d) for x in grid]
        if tokens == "exact":
            r = simplex_switch_ratio(N, rho, betas)[None]  # (1, G)
        else:
            r = switch_ratios(N, betas, tokens=tokens, d_model=d, n_samples=int(p["n_samples"]),
                              seed=int(p.get("draw_seed", 0)))  # (B, G)
        found.append([switch(grid, ri)["gamma_switch"] for ri in r])
    star = np.asarray(found)  # (L, B)
    return rows_from_metrics({"gamma_switch": star, "gamma_distance": np.abs(star - gamma_c) / gamma_c}, {},
                             layers=layers, points=[f"n_tokens.{n}" for n in sizes])


#: the rows of a gap_count unit: the model's logits and two synthetic ones of matched variance
GAP_LOGITS = ("model", "gaussian", "uniform")
#: metric name -> key of :func:`rankcollapse.metrics.attention.gap_growth`'s result
GAP_METRICS = {"gap_r2_exp": "r2_exp", "gap_r2_pow": "r2_pow", "gap_rate": "rate", "gap_exponent": "exponent"}
#: the keys nearest each row's maximum that the fits read (k = 2..GAP_K_MAX)
GAP_K_MAX = 32


def gap_count_rows(maps: dict[str, Any], draw_seed: int = 0, *, mask: str = "complete") -> pd.DataFrame:
    """Rows of one ``gap_count`` unit from the maps ``{"layer.k.attention": (B, H, N, N)}``."""
    import torch

    from ..masks.adapt import dense_mask
    from ..metrics.attention import gap_growth
    from ..metrics.floor import epsilon

    gen = torch.Generator().manual_seed(int(draw_seed))
    names = sorted(maps, key=lambda n: int(n.split(".")[-2]))
    n_tokens = maps[names[0]].shape[-1]
    full = dense_mask(mask, n_tokens).sum(-1) > GAP_K_MAX  # (N,) rows with every fit point
    if not bool(full.any()):
        raise ConfigError(f"gap_count needs a row with more than {GAP_K_MAX} keys (the fit reads the {GAP_K_MAX} "
                          f"nearest each row's maximum); windows of {n_tokens} tokens under a {mask} mask have none")
    per: dict[str, dict[str, list[np.ndarray]]] = {v: {m: [] for m in [*GAP_METRICS, "gap_fit_advantage"]}
                                                   for v in GAP_LOGITS}
    for name in names:
        z = torch.log(maps[name][..., full, :].to(torch.float64))  # (B, H, R, N); -inf at keys with no mass
        allowed = z > -math.inf
        zf = z.masked_fill(~allowed, 0.0)
        m = allowed.sum(-1, keepdim=True).clamp(min=1)
        mean = zf.sum(-1, keepdim=True) / m
        std = torch.sqrt(((zf - mean) ** 2 * allowed).sum(-1, keepdim=True) / m)  # each row's logit std
        flat = (std <= epsilon(str(maps[name].dtype).removeprefix("torch.")) * mean.abs().clamp(min=1)).squeeze(-1)
        gauss = torch.randn(z.shape, generator=gen, dtype=torch.float64) * std
        unif = (torch.rand(z.shape, generator=gen, dtype=torch.float64) * 2 - 1) * math.sqrt(3) * std
        for variant, logits in zip(GAP_LOGITS, (z, gauss, unif)):
            fit = gap_growth(logits.masked_fill(~allowed, -math.inf), k_max=GAP_K_MAX)
            fit["fit_advantage"] = fit["r2_exp"] - fit["r2_pow"]
            fit["rate"] = fit["rate"].masked_fill(flat, math.nan)  # no logit scale: a rate of round-off
            for metric, key in [*GAP_METRICS.items(), ("gap_fit_advantage", "fit_advantage")]:
                per[variant][metric].append(fit[key].flatten(1).nanmean(-1).numpy())  # (B,)
    layers = [int(n.split(".")[-2]) + 1 for n in names]
    parts = [rows_from_metrics({k: np.stack(v) for k, v in per[variant].items()}, {"variant": variant},
                               layers=layers, points=names) for variant in GAP_LOGITS]
    return pd.concat(parts, ignore_index=True)


def run_gap_count(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``gap_count`` unit kind: ``model``, ``n_samples``, optionally ``control``
    (``random-init``), ``batch_size`` (8), ``draw_seed`` (0)."""
    from ..models.probe import attention_maps

    p = unit.params
    loaded, win, labels = _model_unit(unit, ctx)
    maps = attention_maps(loaded, win, batch_size=int(p.get("batch_size", 8)))
    labels.pop("variant")
    labels.pop("family")
    return normalise(gap_count_rows(maps, int(p.get("draw_seed", 0)), mask=labels["mask"]), labels)


def run_temperature_switch(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``temperature_switch`` unit kind."""
    p = unit.params
    tokens = str(p.get("tokens", "simplex"))
    d = "inf" if tokens == "exact" else int(p.get("d_model", 64))
    labels = _labels(unit, model=tokens, variant=f"{p.get('law', 'log')},d={d}", mask="complete",
                     mask_spec="complete", dtype="float64")
    return normalise(temperature_switch_rows(p), labels)


register("temperature_law", run_temperature_law, 1)
register("gap_count", run_gap_count, 3)
register("temperature_switch", run_temperature_switch, 1)
