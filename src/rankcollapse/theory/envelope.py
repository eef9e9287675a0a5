"""Theorem 1's envelope of a mask before any run: its fastest certified rate and the
depth at which it crosses a threshold (spec.md §5.1; envelope in :mod:`.bound`).

For a quasi-strongly connected mask of radius ``r`` with self-loops and every allowed
attention entry ``≥ ε``, Theorem 1 gives (docs/spec.md § "Theorem 1: a rigorous
envelope", :func:`~.bound.check_collapse_bound`)

``μ(X(t)) ≤ C (1 - ε^r)^{t/r}``, ``C ≤ √N μ(X(0)) / (1 - ε^r)``,

so relative to the input ``μ(X(t)) / μ(X(0)) ≤ E(t) = √N (1 - ε^r)^{t/r - 1}``.

``ε`` is a property of the trajectory. Before a run it is bounded by the mask alone:
the row with the most allowed keys (``deg_max`` of them) has entries summing to 1, so
``ε ≤ 1 / deg_max``, reached by uniform attention. With that ε the envelope is the
fastest the theorem can certify for the mask: every trajectory's envelope decays at a
per-layer rate ``≥ ρ* = (1 - deg_max^{-r})^{1/r}``, and no envelope crosses a threshold
τ before ``t*(τ)``, the least ``t`` with ``E(t) ≤ τ``. A measured rate below ρ* does not
contradict the theorem (it bounds μ from above); it says the data collapse faster than
the theorem can guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..masks import analyze, resolve_mask

#: Depth cap of :func:`envelope_crossing_depth` (layers; cheap at N = 128).
MAX_DEPTH = 4096


@dataclass(frozen=True)
class EnvelopeDepth:
    """The Theorem-1 envelope of one mask at one threshold.

    ``depth``: least layer ``t`` with ``E(t) ≤ threshold``, or ``cap`` when it is deeper
    (``capped`` true); ``rate``: per-layer envelope rate ``(1 - ε^r)^{1/r}``;
    ``epsilon``, ``radius``, ``n_tokens``: the inputs; ``exact_depth``: the real-valued
    solution (may exceed the cap; ``inf`` when ``ε^r`` underflows to 0 in float64).
    """

    mask: str
    n_tokens: int
    radius: int
    epsilon: float
    rate: float
    threshold: float
    depth: int
    capped: bool
    exact_depth: float
    cap: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def theorem1_mask(mask: Any, n: int | None) -> tuple[Any, Any]:
    """``(resolved mask, its analysis)`` for a mask Theorem 1 applies to.

    Raises
    ------
    ConfigError
        Fewer than 2 tokens (radius 0: μ is identically 0, no rate), a mask that is not
        quasi-strongly connected, or one without self-loops (the envelope's proof needs them).
    """
    m = resolve_mask(mask, n)
    if m.n_tokens < 2:
        raise ConfigError(f"Theorem 1 needs at least 2 tokens, got N={m.n_tokens}")
    info = analyze(m.mask())
    if not info.quasi_strongly_connected:
        raise ConfigError(f"mask {m.spec!r} is not quasi-strongly connected ({info.reason}): Theorem 1 does not apply")
    if not info.self_loops:
        raise ConfigError(f"mask {m.spec!r} lacks self-loops: the envelope's proof needs them")
    return m, info


def _mask_terms(mask: Any, n: int | None) -> tuple[str, int, int, int]:
    m, info = theorem1_mask(mask, n)
    deg_max = int(m.dense().sum(dim=1).max())
    return m.spec, m.n_tokens, int(info.radius), deg_max


def envelope_rate(mask: Any, n: int | None = None, *, epsilon: float | None = None) -> float:
    """Per-layer rate ``(1 - ε^r)^{1/r}`` of the Theorem-1 envelope of ``mask``.

    Parameters
    ----------
    mask : Mask, bool ``(N, N)`` or spec string (with ``n``); QSC with self-loops.
    epsilon : smallest allowed attention entry, in (0, 1]; default ``1 / deg_max``, the
        largest it can be, which gives the fastest rate the theorem certifies.

    Returns
    -------
    float in [0, 1]; 1.0 exactly when ``ε^r`` underflows float64 (no certified decay).

    Raises
    ------
    ConfigError
        A mask that is not QSC or lacks self-loops, fewer than 2 tokens, ε outside (0, 1].
    MaskError
        A spec without ``n``, or an invalid mask.
    """
    _, _, r, deg_max = _mask_terms(mask, n)
    eps = _epsilon(epsilon, deg_max)
    return math.exp(math.log1p(-(eps**r)) / r) if eps**r < 1 else 0.0


def _epsilon(epsilon: float | None, deg_max: int) -> float:
    eps = 1.0 / deg_max if epsilon is None else float(epsilon)
    if not 0 < eps <= 1:
        raise ConfigError(f"epsilon must be in (0, 1], got {epsilon}")
    return eps


def envelope_crossing_depth(mask: Any, threshold: float, n: int | None = None, *, epsilon: float | None = None,
                            cap: int = MAX_DEPTH) -> EnvelopeDepth:
    """Least depth at which the Theorem-1 envelope of ``mask`` relative to the input,
    ``E(t) = √N (1 - ε^r)^{t/r - 1}``, is at or below ``threshold`` (module docstring):
    ``t* = ⌈r (1 + ln(τ/√N) / ln(1 - ε^r))⌉``, at least 0, capped at ``cap``.

    With the default ε (``1 / deg_max``) no trajectory of pure SA with orthogonal W_V is
    guaranteed below ``threshold`` before ``t*``: a collapse claim read at a shallower
    depth is decided by the data, not by the theorem.

    Parameters
    ----------
    mask, n, epsilon : as :func:`envelope_rate`.
    threshold : τ in (0, 1), a fraction of the input μ.
    cap : largest depth returned (layers, ≥ 1).

    Raises
    ------
    ConfigError
        ``threshold`` outside (0, 1), ``cap`` < 1, or as :func:`envelope_rate`.
    """
    if not 0 < float(threshold) < 1:
        raise ConfigError(f"threshold must be in (0, 1), got {threshold}")
    if int(cap) < 1:
        raise ConfigError(f"cap must be >= 1, got {cap}")
    spec, N, r, deg_max = _mask_terms(mask, n)
    eps = _epsilon(epsilon, deg_max)
    contraction = eps**r
    if contraction >= 1:  # ε = 1: the bound (1 - ε^r) is 0, μ is certified 0 at once
        exact = 0.0
    elif contraction == 0:  # ε^r below float64: the envelope certifies nothing
        exact = math.inf
    else:
        exact = r * (1 + math.log(float(threshold) / math.sqrt(N)) / math.log1p(-contraction))
    depth = max(0, math.ceil(exact - 1e-9)) if math.isfinite(exact) else math.inf
    capped = depth > cap
    rate = math.exp(math.log1p(-contraction) / r) if contraction < 1 else 0.0
    return EnvelopeDepth(spec, N, r, eps, rate, float(threshold), int(cap if capped else depth), bool(capped),
                         float(exact), int(cap))
