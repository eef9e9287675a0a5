"""Every Theorem-1 quantity, for masks (period-1 schedules) and schedules alike (spec.md §5.1,
docs/theory.md §1, §7). With orthogonal ``W_V(t)``, self-loops and every allowed entry ``≥ ε``,
``μ(X(t)) ≤ C (1 - ε^e)^{t/e}``, ``C = (√N / 2) ‖osc(X(0))‖₂ / (1 - ε^e) ≤ √N μ(X(0)) / (1 - ε^e)``,
with the effective radius ``e = min(p r_H, L)`` (``r_H`` the radius of the composed graph, ``L``
the scrambling length: every window of ``L`` layers composes to a graph with a full column).
Before a run ``ε ≤ 1 / deg_max``, the fastest rate the theorem certifies. Rates in log space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .._memory import check_memory
from .._validate import check_float, check_int
from ..errors import ConfigError

#: Envelope exponents: ``t/r`` (Theorem 1 as proved, k = 1) and the weaker ``t/(2r)`` (k = 2).
EXPONENTS = {"t/r": 1, "t/(2r)": 2}

#: Depth cap of :func:`envelope_crossing_depth` (layers).
MAX_DEPTH = 4096


def check_exponent(exponent: str) -> int:
    """``k`` of an envelope exponent (1 for ``"t/r"``, 2 for ``"t/(2r)"``); ConfigError otherwise."""
    if exponent not in EXPONENTS:
        raise ConfigError(f"exponent must be one of {sorted(EXPONENTS)}, got {exponent!r}")
    return EXPONENTS[exponent]


def _log_power(epsilon: float, radius: int, exponent: str) -> tuple[int, float]:
    """``k`` of ``exponent`` and ``log(ε^e)``, ``e = radius``, both checked."""
    k = check_exponent(exponent)
    if not 0.0 < epsilon < 1.0:
        raise ConfigError(f"epsilon must lie in (0, 1), got {epsilon}")
    check_int(radius, "radius", low=1)
    return k, radius * math.log(epsilon)


def log_contraction(epsilon: float, radius: int, *, exponent: str = "t/r") -> float:
    """Natural log (< 0) of the per-layer factor ``(1 - ε^e)^{1/(k e)}``, ``e = radius`` (effective
    radius for a schedule), ``k`` of :func:`check_exponent`; ``-ε^e`` in log space when ``ε^e``
    underflows, so never exactly 0. Raises ConfigError for ``epsilon`` outside (0, 1),
    ``radius < 1`` or an unknown exponent."""
    k, log_x = _log_power(epsilon, radius, exponent)
    if log_x > -700:
        return math.log1p(-math.exp(log_x)) / (k * radius)
    return -math.exp(log_x - math.log(k * radius))


def log10_layers_per_decade(epsilon: float, radius: int, *, exponent: str = "t/r") -> float:
    """``log10`` of the layers the envelope needs to fall by 10x, ``ln(10) / -log(factor)``, in log
    space (finite even for ``ε^e`` ~ 1e-5000). Raises ConfigError as :func:`log_contraction`."""
    k, log_x = _log_power(epsilon, radius, exponent)
    if log_x > -700:
        log_neg = math.log(-math.log1p(-math.exp(log_x))) - math.log(k * radius)
    else:
        log_neg = log_x - math.log(k * radius)
    return (math.log(math.log(10.0)) - log_neg) / math.log(10.0)


def collapse_envelope(t: np.ndarray | Sequence[float] | float, epsilon: float, radius: int, *,
                      exponent: str = "t/r", C: float = 1.0) -> np.ndarray:
    """Theorem 1 envelope ``C (1 - ε^e)^{t/(k e)}`` at layers ``t`` (float64; Wu et al. 2024).
    Raises ConfigError for ``t < 0`` or as :func:`log_contraction`."""
    t = np.asarray(t, dtype=np.float64)
    if (t < 0).any():
        raise ConfigError("layer indices t must be >= 0")
    return C * np.exp(t * log_contraction(epsilon, radius, exponent=exponent))


def epsilon_lower_bound(*, d_qk: float, token_norm: float, weight_norm: float, max_in_degree: int) -> float:
    """Lower bound on every allowed attention entry (assumption A1): with ``||x_i|| <= R``
    (``token_norm``) and ``||W_Q||_2, ||W_K||_2 <= C`` (``weight_norm``) every logit has
    ``|s_ij| <= C^2 R^2 / sqrt(d_qk) =: s``, so ``eps = exp(-2 s) / max_i |K(i)|``.
    Raises ConfigError for non-positive ``d_qk``, negative norms or an in-degree < 1."""
    if d_qk <= 0 or token_norm < 0 or weight_norm < 0:
        raise ConfigError(f"need d_qk > 0 and norms >= 0, got d_qk={d_qk}, "
                          f"token_norm={token_norm}, weight_norm={weight_norm}")
    if max_in_degree < 1:
        raise ConfigError(f"max_in_degree must be >= 1, got {max_in_degree}")
    s = weight_norm**2 * token_norm**2 / math.sqrt(d_qk)
    return math.exp(-2.0 * s) / max_in_degree


def measured_envelope(X0: Any, epsilon: Any, radius: int, depth: int, *, exponent: str = "t/r") -> tuple[Any, Any]:
    """``(envelope (depth+1, B), rate (B,))`` float64 of a measured trajectory from inputs ``X0``
    ``(B, N, d)``, per-sample ``epsilon`` ``(B,)`` and effective radius ``radius``:
    ``C = (√N / 2) ‖osc(X0)‖₂ / (1 - ε^e)``, ``rate = (1 - ε^e)^{1/(k e)}``.
    Raises ConfigError for an unknown exponent."""
    import torch

    k = check_exponent(exponent)
    N = X0.shape[1]
    contraction = 1 - epsilon**radius
    osc = (X0.amax(1) - X0.amin(1)).to(torch.float64)  # (B, d)
    C = math.sqrt(N) / 2 * torch.linalg.vector_norm(osc, dim=1) / contraction
    power = torch.arange(depth + 1, dtype=torch.float64).unsqueeze(1) / (k * radius)
    return C * contraction**power, contraction ** (1 / (k * radius))


@dataclass(frozen=True)
class Theorem1Terms:
    """The graph facts Theorem 1's envelope of a mask or schedule rests on: ``radius`` ``r_H`` of
    the composed graph (None when not QSC), ``scrambling_length`` ``L`` (None when not QSC or a
    layer lacks self-loops), ``max_in_degree`` over the period's masks, ``reason`` when not QSC."""

    spec: str
    n_tokens: int
    period: int
    quasi_strongly_connected: bool
    self_loops: bool
    radius: int | None
    scrambling_length: int | None
    max_in_degree: int
    reason: str | None = None

    @property
    def period_radius(self) -> int | None:
        """``p r_H``: the exponent of the period-aligned envelope (docs/theory.md §7)."""
        return None if self.radius is None else self.period * self.radius

    @property
    def effective_radius(self) -> int | None:
        """``min(p r_H, L)`` (``p r_H`` when ``L`` is undefined), the envelope's exponent; None when not QSC."""
        pr, L = self.period_radius, self.scrambling_length
        return pr if L is None else (L if pr is None else min(pr, L))

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "period_radius": self.period_radius, "effective_radius": self.effective_radius}


def theorem1_terms(source: Any, n_tokens: int | None = None, *, max_memory: int | str | None = None) -> Theorem1Terms:
    """:class:`Theorem1Terms` of a mask or a schedule (any form of
    :func:`~rankcollapse.masks.resolve_mask` or :func:`~rankcollapse.masks.parse_schedule`);
    fields are None where Theorem 1 does not apply (:func:`require_theorem1` refuses). ``L = r``
    for period 1, else searched (:func:`scrambling_search`). ``n_tokens``: N, needed for a spec.
    Raises MaskError or ConfigError for a bad spec or schedule or one without ``n_tokens``,
    MemoryLimitError when the graph analysis would exceed ``max_memory``.
    """
    from ..masks import analyze, resolve_mask
    from ..masks.schedule import MaskSchedule, is_schedule, parse_schedule

    spec = None
    if is_schedule(source):
        if n_tokens is None and not isinstance(source, MaskSchedule):
            raise ConfigError("a schedule needs the number of tokens n_tokens")
        sched = parse_schedule(source, source.n_tokens if n_tokens is None else n_tokens)
        if sched.period > 1:
            return schedule_terms(sched, max_memory=max_memory)
        source, spec = sched.masks[0], sched.spec
    resolved = resolve_mask(source, n_tokens)
    return mask_terms(analyze(resolved, max_memory=max_memory), spec or resolved.spec)


def mask_terms(info: Any, spec: str | None = None) -> Theorem1Terms:
    """:class:`Theorem1Terms` of one mask from its :class:`~rankcollapse.masks.MaskAnalysis`
    (``L = r`` with self-loops)."""
    qsc = bool(info.quasi_strongly_connected)
    r = int(info.radius) if qsc else None
    return Theorem1Terms(spec or info.spec, int(info.n_tokens), 1, qsc, bool(info.self_loops), r,
                         r if qsc and info.self_loops else None, int(info.in_degree["max"]), info.reason)


def schedule_terms(sched: Any, info: Any = None, *, max_memory: int | str | None = None) -> Theorem1Terms:
    """:class:`Theorem1Terms` of a :class:`~rankcollapse.masks.MaskSchedule`; ``info``: the composed
    graph's :class:`~rankcollapse.masks.MaskAnalysis` if the caller has it."""
    from ..masks import analyze

    if info is None:
        info = analyze(sched.composed(), max_memory=max_memory)
    facts = [_layer_facts(m) for m in {id(m): m for m in sched.masks}.values()]  # each distinct layer once
    loops = all(f[0] for f in facts)
    qsc = bool(info.quasi_strongly_connected)
    r = int(info.radius) if qsc else None
    N, p = sched.n_tokens, sched.period
    L = None if not (qsc and loops) else r if p == 1 else scrambling_search(sched, r, max_memory=max_memory)
    return Theorem1Terms(sched.spec, N, p, qsc, loops, r, L, max(f[1] for f in facts), info.reason)


def _layer_facts(mask: Any) -> tuple[bool, int]:
    """``(every token attends itself, most keys of a query)`` of one layer mask."""
    if mask.intervals is not None:
        lo, hi = mask.intervals
        idx = np.arange(lo.shape[0])
        return bool(((lo <= idx) & (idx <= hi)).all()), int((hi - lo + 1).max())
    csr = mask.to_csr()
    return bool(csr.diagonal().all()), int(np.diff(csr.indptr).max())


def scrambling_length(source: Any, n_tokens: int | None = None) -> int | None:
    """Scrambling length ``L`` of a schedule or mask (module docstring; docs/theory.md §7); None
    when not QSC or a layer lacks self-loops. Forms and errors: :func:`theorem1_terms`."""
    return theorem1_terms(source, n_tokens).scrambling_length


def require_theorem1(source: Any, n_tokens: int | None = None) -> Theorem1Terms:
    """:func:`theorem1_terms` of a mask or schedule the envelope applies to. Raises ConfigError for
    fewer than 2 tokens, a composed graph that is not QSC or a layer without self-loops."""
    terms = theorem1_terms(source, n_tokens)
    if terms.n_tokens < 2:
        raise ConfigError(f"Theorem 1 needs at least 2 tokens, got N={terms.n_tokens}")
    what = "mask" if terms.period == 1 else "schedule"
    if not terms.quasi_strongly_connected:
        graph = "" if terms.period == 1 else " (its composed graph)"
        raise ConfigError(f"{what} {terms.spec!r}{graph} is not quasi-strongly connected ({terms.reason}): "
                          "Theorem 1 does not apply")
    if not terms.self_loops:
        raise ConfigError(f"{what} {terms.spec!r} lacks self-loops: the envelope's proof needs them")
    return terms


@dataclass(frozen=True)
class EnvelopeDepth:
    """The Theorem-1 envelope of one mask or schedule at one threshold: ``depth`` the least layer
    with ``E(t) ≤ threshold`` (``cap`` when deeper, ``capped``), ``rate`` ``(1 - ε^e)^{1/e}``,
    ``radius`` the effective radius ``e``, ``exact_depth`` the real-valued solution (``inf`` when
    ``ε^e`` underflows)."""

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
    period: int = 1
    scrambling_length: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def epsilon_uniform(max_in_degree: int) -> float:
    """``1 / deg_max``, the largest smallest entry of a row-stochastic attention on the mask: the
    default ε of :func:`envelope_rate` and :func:`envelope_crossing_depth` (fastest certified rate)."""
    return 1.0 / max_in_degree


def _epsilon(epsilon: float | None, deg_max: int) -> float:
    eps = epsilon_uniform(deg_max) if epsilon is None else float(epsilon)
    if not 0 < eps <= 1:
        raise ConfigError(f"epsilon must be in (0, 1], got {epsilon}")
    return eps


def _rate(eps: float, e: int) -> float:
    """``(1 - ε^e)^{1/e}`` for ε in (0, 1]: 0 at ε = 1 (μ certified 0 at once)."""
    return 0.0 if eps >= 1 else math.exp(log_contraction(eps, e))


def envelope_rate(mask: Any, n_tokens: int | None = None, *, epsilon: float | None = None) -> float:
    """Per-layer rate ``(1 - ε^e)^{1/e}`` in [0, 1] of the Theorem-1 envelope of a mask or schedule
    (``e`` the effective radius) with ``epsilon`` in (0, 1] (default :func:`epsilon_uniform`).
    Raises ConfigError as :func:`require_theorem1` or for ε outside (0, 1], MaskError for a bad mask.
    """
    terms = require_theorem1(mask, n_tokens)
    return _rate(_epsilon(epsilon, terms.max_in_degree), terms.effective_radius)


def envelope_crossing_depth(mask: Any, threshold: float, n_tokens: int | None = None, *, epsilon: float | None = None,
                            cap: int = MAX_DEPTH) -> EnvelopeDepth:
    """Least depth at which the envelope relative to the input, ``E(t) = √N (1 - ε^e)^{t/e - 1}``,
    is at or below ``threshold``: ``t* = ⌈e (1 + ln(τ/√N) / ln(1 - ε^e))⌉``, capped at ``cap``.

    ``mask``, ``n_tokens``, ``epsilon`` as :func:`envelope_rate`. Raises ConfigError for
    ``threshold`` outside (0, 1), ``cap`` < 1, or as :func:`envelope_rate`.
    """
    threshold = check_float(threshold, "threshold")
    if not 0 < threshold < 1:
        raise ConfigError(f"threshold must be in (0, 1), got {threshold}")
    cap = check_int(cap, "cap", low=1)
    terms = require_theorem1(mask, n_tokens)
    N, e = terms.n_tokens, terms.effective_radius
    eps = _epsilon(epsilon, terms.max_in_degree)
    if eps >= 1:  # the bound (1 - ε^e) is 0: μ is certified 0 at once
        exact = 0.0
    else:
        log_factor = e * log_contraction(eps, e)  # ln(1 - ε^e)
        exact = math.inf if log_factor == 0 else e * (1 + math.log(float(threshold) / math.sqrt(N)) / log_factor)
    depth = max(0, math.ceil(exact - 1e-9)) if math.isfinite(exact) else math.inf
    capped = depth > cap
    return EnvelopeDepth(terms.spec, N, e, eps, _rate(eps, e), float(threshold), int(cap if capped else depth),
                         bool(capped), float(exact), int(cap), terms.period, terms.scrambling_length)


def predicted_rate(terms: Theorem1Terms, *, d_qk: float = 1.0, token_norm: float = 1.0, weight_norm: float = 1.0,
                   exponent: str = "t/r") -> dict[str, Any]:
    """Envelope rate from the a-priori entry bound (A1): ``epsilon_bound``
    (:func:`epsilon_lower_bound`), ``log10_rate_per_layer`` (log10 of ``(1 - ε^e)^{1/(k e)}``) and
    ``log10_layers_per_decade``, both None when not QSC. Raises ConfigError as :func:`epsilon_lower_bound`."""
    eps = epsilon_lower_bound(d_qk=d_qk, token_norm=token_norm, weight_norm=weight_norm,
                              max_in_degree=terms.max_in_degree)
    e = terms.effective_radius
    if e is None or e < 1 or not 0.0 < eps < 1.0:
        return {"epsilon_bound": eps, "log10_rate_per_layer": None, "log10_layers_per_decade": None}
    return {"epsilon_bound": eps, "log10_rate_per_layer": log_contraction(eps, e, exponent=exponent) / math.log(10),
            "log10_layers_per_decade": log10_layers_per_decade(eps, e, exponent=exponent)}


def _interval_window(layers: list[tuple[np.ndarray, np.ndarray]], start: int, cap: int) -> int | None:
    from ..masks import interval_graph

    p = len(layers)
    prod = layers[start % p]
    for length in range(1, cap + 1):
        if interval_graph.has_full_column(*prod):
            return length
        prod = interval_graph.compose(layers[(start + length) % p], prod)
    return None


def _sparse_window(layers: list[Any], candidates: np.ndarray, start: int, cap: int) -> int | None:
    """Window search on bool CSR layers; a window is rooted when a column of its product is all True."""
    p, n = len(layers), layers[0].shape[0]
    prod = layers[start % p][:, candidates]
    for length in range(1, cap + 1):
        if prod.nnz and int(np.bincount(prod.indices, minlength=prod.shape[1]).max()) == n:
            return length
        prod = layers[(start + length) % p] @ prod  # bool @ bool: scipy's boolean product
    return None


def scrambling_search(schedule: Any, radius: int, *, max_memory: int | str | None = None) -> int | None:
    """``L`` of a :class:`~rankcollapse.masks.MaskSchedule` with self-loops whose composed graph
    is QSC with radius ``radius``; None if some phase has no rooted window within the cap.
    ``L = max_s L(s)`` over the phases, each the least window length with a full column (at most
    ``p (r_H + 1) - 1``), composed as intervals or as sparse products restricted to the candidate
    roots (the centers of the union of the layer graphs; docs/theory.md §7).
    Raises :class:`MemoryLimitError` when the sparse products would exceed ``max_memory``."""
    import scipy.sparse as sp

    from ..masks import Mask, analyze

    p, n = schedule.period, schedule.n_tokens
    cap = p * (radius + 1) - 1
    intervals = schedule.intervals()
    if intervals is not None:
        windows = (_interval_window(intervals, s, cap) for s in range(p))
    else:
        layers = [sp.csr_array(m.to_csr(), dtype=bool) for m in schedule.masks]
        union = sum(layers[1:], start=layers[0])  # bool + bool: logical or
        # the candidate roots: the centers of the union (none when it is not QSC)
        centers = analyze(Mask(n, "union", csr=union), max_memory=max_memory).centers
        candidates = np.asarray(centers, dtype=np.int64)
        check_memory(9.0 * n * len(candidates), f"the scrambling-length search of {schedule.spec!r} at N = {n}",
                     max_memory)
        windows = (_sparse_window(layers, candidates, s, cap) for s in range(p))
    best = 0
    for length in windows:
        if length is None:
            return None
        best = max(best, length)
    return best
