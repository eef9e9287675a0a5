"""The measured collapse rate of a metric trajectory: one least-squares fit for every caller.

Model ``log v(t) = a + b t + e(t)`` over the layers above the ``floor``, ``b`` the OLS slope
(natural log per layer), ``exp(b)`` the decay factor. The floor is the computation's, passed
by every caller (docs/reproduce.md, "Floors belong to the computation").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lazy import is_tensor
from ..errors import ConfigError


@dataclass(frozen=True)
class RateFit:
    """A least-squares rate per trajectory (arrays of the input's library): ``slope`` float64
    ``(B,)``, natural log per layer (NaN under 2 layers), and ``n_layers`` int ``(B,)`` fitted."""

    slope: Any
    n_layers: Any

    @property
    def rate(self):
        """``exp(slope)``: the per-layer decay factor ``(B,)``."""
        return self.slope.exp() if is_tensor(self.slope) else np.exp(self.slope)

    @property
    def decades(self):
        """``slope / ln 10``: decades per layer ``(B,)`` (negative = collapsing)."""
        return self.slope / math.log(10.0)


def least_squares_rate(values, *, floor, layers=None, shared: bool = False, before_floor: bool = False) -> RateFit:
    """Least-squares rate of ``values`` ``(T,)`` or ``(T, B)`` (layers along axis 0), in the
    input's library (numpy or torch).

    Parameters
    ----------
    values : numpy array or torch tensor ``(T,)`` / ``(T, B)``, one trajectory per column;
        fitted in float64.
    floor : float, or ``(B,)`` of the same library: values ``<= floor`` are left out.
    layers : ``(T,)`` abscissae (default ``0 .. T-1``).
    shared : select the layers by column 0 (a point estimate) and fit every column (its
        replicates, clipped below at the smallest positive float64) on them; numpy only.
    before_floor : fit only the layers before the first at or below the floor (or non-finite).

    Returns a :class:`RateFit` per column (``(1,)`` for 1-D ``values``); raises
    :class:`ConfigError` for ``values`` not ``(T,)``/``(T, B)``, ``layers`` not of length ``T``,
    or ``shared`` with a tensor.
    """
    v = values.double() if is_tensor(values) else np.asarray(values, dtype=np.float64)
    if v.ndim not in (1, 2) or v.shape[0] < 1:
        raise ConfigError(f"least_squares_rate needs values of shape (T,) or (T, B), got {tuple(v.shape)}")
    v = v.reshape(v.shape[0], -1)
    T, B = v.shape
    t = _arange(v, T) if layers is None else layers
    if tuple(t.shape) != (T,):
        raise ConfigError(f"layers must have length {T}, got shape {tuple(t.shape)}")
    above = v > floor
    if before_floor:
        above = above.cumprod(0) > 0 if is_tensor(above) else np.cumprod(above, axis=0) > 0
    if shared:
        if is_tensor(v):
            raise ConfigError("least_squares_rate(shared=True) takes numpy values")
        keep = above[:, 0]
        if keep.sum() < 2:
            return RateFit(np.full(B, np.nan), np.full(B, int(keep.sum())))
        with np.errstate(divide="ignore"):
            y = np.log(np.maximum(v[keep], np.finfo(np.float64).tiny)).T  # (B, k)
        x = np.asarray(t, dtype=np.float64)[keep]
        xc = x - x.mean()
        return RateFit((y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc), np.full(B, int(keep.sum())))
    n = above.sum(0)
    slope = _masked_slope(t, v, above)
    return RateFit(slope.where(n >= 2, math.nan) if is_tensor(v) else np.where(n >= 2, slope, np.nan), n)


def _arange(v, T: int):
    if is_tensor(v):
        import torch

        return torch.arange(T, dtype=torch.float64, device=v.device)
    return np.arange(T, dtype=np.float64)


def _masked_slope(t, v, keep):
    """OLS slope of ``log v`` ``(T, B)`` on ``t`` ``(T,)`` per column over the rows ``keep``
    (0/1 weights); 0 for a column with one layer."""
    if is_tensor(v):
        import torch

        w = keep.double()
        tt = t.unsqueeze(1).expand_as(v)
        y = torch.where(keep, v.clamp_min(1e-300).log(), torch.zeros_like(v))
        clip = torch.clamp_min
    else:
        w = keep.astype(np.float64)
        tt = np.broadcast_to(np.asarray(t, dtype=np.float64)[:, None], v.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(keep, np.log(np.maximum(v, 1e-300)), 0.0)
        clip = np.maximum
    n = clip(w.sum(0), 1)
    tm, ym = (w * tt).sum(0) / n, (w * y).sum(0) / n
    return (w * (tt - tm) * (y - ym)).sum(0) / clip((w * (tt - tm) ** 2).sum(0), 1e-300)


#: the laws :func:`fit_decay_law` tells apart
LAWS = ("exponential", "power", "undecided")


@dataclass(frozen=True)
class LawFit:
    """Exponential against power-law fit of a decaying trajectory, per column (numpy ``(B,)``):
    ``rate`` ``b`` of ``log v = a + b t``, ``exponent`` ``p`` of ``log v = a + p log t``, the R² of
    each (NaN under 3 layers or a constant ``log v``), ``law`` (that of the larger R², or
    ``"undecided"``: equal or NaN R², or a slope ``>= 0``) and ``n_layers`` fitted.
    """

    rate: Any
    exponent: Any
    r2_exponential: Any
    r2_power: Any
    law: Any
    n_layers: Any


def fit_decay_law(values, *, floor, layers=None) -> LawFit:
    """Fit ``values`` ``(T,)`` / ``(T, B)`` as exponential (``log v`` linear in ``t``) and as
    power law (``log v`` linear in ``log t``) and say which fits better.

    Made for the cosine gap ``1 - avg_cos`` over depth (post-LN: exponential, pre-LN:
    polynomial; Karagodin et al., NeurIPS 2025). Both slopes are :func:`least_squares_rate`'s
    on the same layers (``t > 0``, before the first value at or below ``floor``); each R² is
    ``b^2 S_xx / S_yy`` (Montgomery & Runger §11-8).

    ``values``, ``floor``, ``layers`` as :func:`least_squares_rate` (fitted in float64 numpy;
    only ``t > 0``); raises :class:`ConfigError` as it does.
    """
    v = values.detach().to("cpu").double().numpy() if is_tensor(values) else np.asarray(values, dtype=np.float64)
    if v.ndim not in (1, 2) or v.shape[0] < 1:
        raise ConfigError(f"fit_decay_law needs values of shape (T,) or (T, B), got {tuple(v.shape)}")
    v = v.reshape(v.shape[0], -1)
    t = np.arange(v.shape[0], dtype=np.float64) if layers is None else np.asarray(layers, dtype=np.float64)
    if t.shape != (v.shape[0],):
        raise ConfigError(f"layers must have length {v.shape[0]}, got shape {t.shape}")
    v, t = v[t > 0], t[t > 0]
    if v.shape[0] == 0:  # no layer with t > 0: nothing to fit
        nan = np.full(v.shape[1], np.nan)
        return LawFit(nan, nan, nan, nan, np.full(v.shape[1], "undecided"), np.zeros(v.shape[1], dtype=int))
    exp_fit = least_squares_rate(v, floor=floor, layers=t, before_floor=True)
    pow_fit = least_squares_rate(v, floor=floor, layers=np.log(t), before_floor=True)
    keep = np.cumprod(v > floor, axis=0) > 0  # the layers both fits used
    r2_e, r2_p = (_r_squared(x, v, keep, fit.slope) for x, fit in ((t, exp_fit), (np.log(t), pow_fit)))
    law = np.where(r2_e > r2_p, "exponential", np.where(r2_p > r2_e, "power", "undecided"))
    decays = (exp_fit.slope < 0) & (pow_fit.slope < 0)  # a flat or rising gap has no decay law
    law = np.where(decays, law, "undecided")
    return LawFit(exp_fit.slope, pow_fit.slope, r2_e, r2_p, law, exp_fit.n_layers)


def _r_squared(x, v, keep, slope):
    """``b^2 S_xx / S_yy`` per column over the rows ``keep`` (NaN under 3 layers or S_yy = 0)."""
    w = keep.astype(np.float64)
    n = w.sum(0)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(keep, np.log(np.maximum(v, 1e-300)), 0.0)
        xx = np.broadcast_to(x[:, None], v.shape)
        xm, ym = (w * xx).sum(0) / n, (w * y).sum(0) / n
        sxx, syy = (w * (xx - xm) ** 2).sum(0), (w * (y - ym) ** 2).sum(0)
        r2 = slope**2 * sxx / syy
    return np.where((n >= 3) & (syy > 0), np.minimum(r2, 1.0), np.nan)
