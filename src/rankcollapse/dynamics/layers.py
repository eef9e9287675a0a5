"""Normalisations, the MLP sublayer, attention on a mask (dense, windowed, FlexAttention, per-layer
schedules) and one block of the simulated network (update rules: :class:`~.config.BlockConfig`)."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

from .attention import dense_attention, merge_heads, project_qkv, scores_may_overflow
from .config import BlockConfig
from .operators import operator_weights, row_mass_quantiles
from .sparse import BlockPlan, blocked_attention
from .weights import LayerWeights
from ..errors import ConfigError
from ..masks.convert import to_block_mask
from ..masks.mask import Mask

#: what :func:`sphere` makes of a zero row
ZERO_ROWS = ("keep", "raise", "nan")


def sphere(X: torch.Tensor, *, zero_rows: str = "keep", direct: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows divided by their Euclidean norm: ``D X``, ``D = diag(1/||x_i||)`` (spec.md §2, SA-LN),
    ``X`` float ``(..., N, d)``; returns ``(X_normalised, n_zero_rows)`` (0-d int64).

    Rows are first divided by their largest entry, so norms that would overflow or
    underflow still land on the sphere; ``direct=True`` divides rows of normal norm by it
    directly (one rounding fewer, :class:`~rankcollapse.theory.system.AttentionSystem`'s form).

    The one rule for zero rows (every entry exactly 0; docs/dynamics.md, "Records, numerics,
    errors"): never given a direction, counted, and ``zero_rows`` ``"keep"`` (left at 0;
    runs warn once, :func:`warn_zero_rows`), ``"raise"`` or ``"nan"``. No device sync except
    with ``"raise"`` or ``direct``. Raises ``ConfigError``: ``zero_rows="raise"`` and a zero row; an
    unknown ``zero_rows``."""
    if zero_rows not in ZERO_ROWS:
        raise ConfigError(f"zero_rows must be one of {ZERO_ROWS}, got {zero_rows!r}")
    if direct:
        norm = torch.linalg.vector_norm(X, dim=-1, keepdim=True)
        info = torch.finfo(X.dtype)
        normal = (norm >= info.tiny) & (norm <= info.max)
        if bool(normal.all()):  # one sync; the common case: no zero row, the plain division alone
            return X / norm, X.new_zeros((), dtype=torch.int64)
    peak = X.abs().amax(dim=-1, keepdim=True)
    zero = peak == 0
    Y = X / peak.masked_fill(zero, 1.0)
    out = Y / torch.linalg.vector_norm(Y, dim=-1, keepdim=True).masked_fill(zero, 1.0)
    if direct:
        out = torch.where(normal, X / norm.masked_fill(~normal, 1.0), out)  # fill: no inf in the unused branch
    if zero_rows == "raise" and bool(zero.any()):
        rows = zero.squeeze(-1).nonzero().tolist()[:5]
        raise ConfigError(f"SA-LN step undefined: rows {rows} are zero before normalisation (no direction)")
    if zero_rows == "nan":
        out = out.masked_fill(zero, float("nan"))
    return out, zero.sum()


def warn_zero_rows(zero_rows: list[int], stacklevel: int = 2) -> None:
    """One ``RuntimeWarning`` naming the layers (1-based) whose ``sphere`` norm met zero rows."""
    if any(zero_rows):
        warnings.warn(f"sphere normalisation met zero rows (left at zero) in layers "
                      f"{[t + 1 for t, z in enumerate(zero_rows) if z]}", RuntimeWarning, stacklevel=stacklevel + 1)


def apply_norm(X: torch.Tensor, cfg: BlockConfig, *, zero_rows: str = "keep", direct: bool = False):
    """``cfg.norm`` of the rows of X (no affine parameters; ``zero_rows``, ``direct``: :func:`sphere`'s);
    returns ``(X, n_zero_rows)``."""
    zero = X.new_zeros((), dtype=torch.int64)
    if cfg.norm == "none":
        return X, zero
    if cfg.norm == "sphere":
        return sphere(X, zero_rows=zero_rows, direct=direct)
    if cfg.norm == "dyt":
        return torch.tanh(cfg.dyt_alpha * X), zero
    if cfg.norm == "layernorm":
        return F.layer_norm(X, (X.shape[-1],), None, None, cfg.eps), zero
    return F.rms_norm(X, (X.shape[-1],), None, cfg.eps), zero


def mlp(X: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
    """``GELU(X W_1 + b_1) W_2 + b_2`` (Hendrycks & Gimpel 2016 GELU, erf form)."""
    H = F.gelu(X @ lw.W_1 + (0 if lw.b_1 is None else lw.b_1))
    return H @ lw.W_2 + (0 if lw.b_2 is None else lw.b_2)


class Attention:
    """Masked self-attention on a fixed mask, with optional records. ``mask_dense`` (bool ``(N, N)``),
    ``plan`` (:class:`BlockPlan`) or ``flex`` (:class:`FlexBackend`): exactly one is given; ``make_plan``:
    ``() -> BlockPlan`` for flex layers whose scores may overflow; ``d_qk``: temperature, scores ``q k^T /
    sqrt(d_qk)`` unless the layer sets ``scale``; ``uniform``: ``W_Q = W_K = 0``; ``record_epsilon``,
    ``record_attention``: keep the smallest allowed entry / the matrices; ``operator``: a non-row-stochastic
    :class:`~.operators.AttentionOperator` (dense; each layer records its row-mass deficit quantiles in
    ``row_mass``), None = softmax; ``scratch``: kept working arrays (:func:`~.attention.kept`), shared with
    the caller's metrics."""

    def __init__(self, *, mask_dense=None, plan: BlockPlan | None = None, flex=None, make_plan=None,
                 d_qk: float = 1.0, uniform: bool = False, record_epsilon: bool = False,
                 record_attention: bool = False, operator=None, scratch: dict | None = None):
        self.mask_dense, self.plan, self.flex, self.make_plan = mask_dense, plan, flex, make_plan
        self.uniform, self.operator, self.default_scale = uniform, operator, 1.0 / math.sqrt(d_qk)
        self.record_epsilon, self.record_attention = record_epsilon, record_attention
        self.epsilon, self.attention, self.row_mass = [], [], []  # per layer: ε, A, (B, H, 3) deficit quantiles
        self._scratch: dict = {} if scratch is None else scratch

    def __call__(self, X: torch.Tensor, lw: LayerWeights, x_peak: float | None = None,
                 qk_norm: float | None = None, head_eps: float | None = None) -> torch.Tensor:
        """Attention output ``(B, N, d)``; ``x_peak`` = ``max |X|`` if known; ``qk_norm`` = ``g``
        (unit queries and keys); ``head_eps``: head-wise RMSNorm (:func:`~.attention.merge_heads`)."""
        if qk_norm is not None:
            Q, K, V = project_qkv(X, replace(lw, W_MV=None), scratch=self._scratch)  # real keys X W_K
            Q, K = F.normalize(Q, dim=-1), F.normalize(K, dim=-1)  # a zero row stays 0
            scale = qk_norm
        else:
            split = self.operator is not None and self.operator.kind == "diff"  # halves of the real q and k
            Q, K, V = project_qkv(X, lw, uniform=self.uniform, scratch=self._scratch, split_qk=split)  # (B, H, N, d_head)
            scale = self.default_scale if lw.scale is None else lw.scale
        overflow = False if qk_norm is not None else None  # |scores| <= |g|; else unknown: reduce over Q, K
        if (qk_norm is None and x_peak is not None and lw.W_MV is not None and lw.position_bias is None
                and not self.uniform):
            # keys are X, queries X W_QK: |q . x| <= d max|x| (max|x| ||W_QK||_1), no pass over Q
            bound = abs(scale) * X.shape[-1] * x_peak * x_peak * lw.W_QK_norm1
            overflow = not bound < torch.finfo(X.dtype).max / 16
        if self.flex is not None:
            if overflow is None:
                overflow = scores_may_overflow(Q, K, scale)
            if not overflow:
                return merge_heads(self.flex(Q, K, V, scale=scale), lw, head_eps)
            if self.plan is None:  # FlexAttention has no float64-score path: the windowed kernel does
                self.plan = self.make_plan()
        if self.plan is not None:
            O, eps = blocked_attention(Q, K, V, self.plan, scale=scale, need_epsilon=self.record_epsilon,
                                       overflow=overflow)
        else:
            bias = None if lw.position_bias is None else lw.position_bias(X.shape[1]).to(X.dtype)
            if self.operator is not None:  # not row-stochastic: dense only, its row-mass deficit recorded
                A = operator_weights(Q, K, self.mask_dense, self.operator, scale=scale, bias=bias)
                self.row_mass.append(row_mass_quantiles(A).cpu())
                O = A @ V
            else:
                need = self.record_epsilon or self.record_attention
                O, A = dense_attention(Q, K, V, self.mask_dense, scale=scale, bias=bias, need_weights=need,
                                       overflow=overflow, scratch=self._scratch)
            # the smallest allowed entry (signed: differential attention may be negative)
            eps = A.masked_fill(~self.mask_dense, float("inf")).amin() if self.record_epsilon else None
            if self.record_attention:
                self.attention.append(A.detach())
        if self.record_epsilon:
            self.epsilon.append(eps)
        return merge_heads(O, lw, head_eps)


class ScheduledAttention:
    """Attention whose mask follows a ``MaskSchedule``: one ``make(mask) -> Attention`` per
    distinct mask, chosen by the layer counter (every block calls its attention once per
    layer); the records go to shared lists in layer order."""

    def __init__(self, schedule, make: Callable[[Mask], Attention]):
        built: dict[int, Attention] = {}
        self.epsilon, self.attention, self.row_mass, self.layers = [], [], [], []
        for m in schedule.masks:
            if id(m) not in built:
                att = make(m)
                att.epsilon, att.attention, att.row_mass = self.epsilon, self.attention, self.row_mass
                built[id(m)] = att
            self.layers.append(built[id(m)])
        self.t = 0

    def __call__(self, X: torch.Tensor, lw, x_peak: float | None = None, **kwargs) -> torch.Tensor:
        att = self.layers[self.t % len(self.layers)]
        self.t += 1
        return att(X, lw, x_peak, **kwargs)


class FlexBackend:
    """``backend="flex"``: ``torch.compile``-d ``flex_attention`` on the ``BlockMask`` of one
    :class:`~rankcollapse.masks.Mask` (:func:`rankcollapse.masks.to_block_mask`, tiles of
    ``block_size``) on ``device``. It computes in the tokens' dtype: :class:`Attention` sends
    layers whose scores may overflow to :mod:`.sparse`. Raises ``ConfigError``: FlexAttention
    missing from this torch."""

    def __init__(self, mask, device, *, block_size: int = 128):
        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError:
            raise ConfigError(f"backend='flex' needs torch.nn.attention.flex_attention "
                              f"(torch {torch.__version__})") from None
        self.block_mask = to_block_mask(mask, block_size=block_size, device=device)
        self._fn = torch.compile(flex_attention, dynamic=False)

    def __call__(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, *, scale: float) -> torch.Tensor:
        """``(B, H, N, d_v)`` masked softmax attention of ``Q, K (B, H, N, d_k)``, ``V``."""
        try:
            return self._fn(Q.contiguous(), K.contiguous(), V.contiguous(), block_mask=self.block_mask, scale=scale)
        except torch._dynamo.exc.TorchDynamoException as exc:  # no compiler for this device
            raise ConfigError(f"backend='flex': torch.compile of flex_attention failed on {Q.device} "
                              f"({type(exc).__name__}: {str(exc).splitlines()[0]}); use backend='blocked'") from None


def qk_norm_scale(cfg: BlockConfig, n_tokens: int) -> float | None:
    """The QK-norm score scale ``g``: ``cfg.qk_norm_scale``, else ``log2(N^2 - N)`` (1 for N = 1);
    None without ``qk_norm``."""
    if not cfg.qk_norm:
        return None
    if cfg.qk_norm_scale is not None:
        return cfg.qk_norm_scale
    return math.log2(n_tokens * n_tokens - n_tokens) if n_tokens > 1 else 1.0


def block_forward(X: torch.Tensor, lw: LayerWeights, cfg: BlockConfig, attend: Attention,
                  x_peak: float | None = None, layer: int = 1):
    """One layer; returns ``(X_next, n_zero_rows)``. ``x_peak``: ``max |X|`` if known;
    ``layer``: the 1-based index (``mix``, ``lns``)."""
    g = qk_norm_scale(cfg, X.shape[-2])
    head_eps = cfg.eps if cfg.headwise_rmsnorm else None

    def sa(Z):  # x_peak bounds the scores only when attention reads the layer's input itself
        return attend(Z, lw, x_peak if Z is X else None, qk_norm=g, head_eps=head_eps)

    return placement_update(X, cfg, sa, layer=layer, mlp=(lambda Z: mlp(Z, lw)) if cfg.mlp else None)


def placement_update(X: torch.Tensor, cfg: BlockConfig, sa, norm=None, *, layer: int = 1, mlp=None):
    """The update rule of ``cfg.placement`` (docs/dynamics.md, "Normalisations") around the
    given sublayers: the one home of the placement rules, for ``simulate`` and the fast path.
    Returns ``(X_next, n_zero_rows)`` of the layer's input ``X`` float ``(..., N, d)``. ``sa``: ``Z ->
    SA(Z)`` (it may test ``Z is X``); ``norm``: ``Y -> (norm(Y), n_zero_rows)``, None: :func:`apply_norm`
    of ``cfg``; ``layer``: the 1-based index ``l`` (``mix``: post-LN while ``l <= mix_layers``; ``lns``:
    ``1/sqrt(l)``); ``mlp``: ``Z -> MLP(Z)`` or None."""
    a, p = cfg.alpha, cfg.placement
    norm = norm or partial(apply_norm, cfg=cfg)
    if p == "none":
        return norm(sa(X))
    if p in ("ngpt", "peri"):  # each sublayer f (SA, then the MLP) in turn, z counting every norm's zero rows
        z = 0
        for f in (sa, mlp):
            if f is None:
                continue
            if p == "ngpt":  # X <- D(X + alpha_ngpt (D f(X) - X)), D the sphere norm
                H, z2 = norm(f(X))
                X, z3 = norm(X + cfg.alpha_ngpt * (H - X))
            else:  # Peri-LN: X <- alpha X + norm(f(norm(X)))
                Xn, z2 = norm(X)
                Y, z3 = norm(f(Xn))
                X = a * X + Y
            z = z + z2 + z3
        return X, z
    if p == "post_ln" or (p == "mix" and layer <= cfg.mix_layers):
        Y = sa(X)
        X, z = norm(Y if a == 0 else a * X + Y)
        if mlp is not None:
            X, z2 = norm(a * X + mlp(X))
            z = z + z2
        return X, z
    # pre_ln, mix after its post-LN layers, lns (LayerNorm scaling: norm output / sqrt(l))
    s = 1.0 / math.sqrt(layer) if p == "lns" else None
    Xn, z = norm(X)
    X = a * X + sa(Xn if s is None else Xn * s)
    if mlp is not None:
        Xn, z2 = norm(X)
        X, z = a * X + mlp(Xn if s is None else Xn * s), z + z2
    return X, z
