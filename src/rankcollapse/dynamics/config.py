"""Configuration of the simulated network: the layer (:class:`BlockConfig`) and the run
(:class:`RunConfig`). The named variants (:data:`VARIANTS`) are presets of
:class:`BlockConfig` (docs/dynamics.md, "Update rules").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .._validate import check_float, check_int
from ..errors import ConfigError
from .operators import parse_attention

NORMS = ("none", "sphere", "layernorm", "rmsnorm", "dyt")
BACKENDS = ("auto", "dense", "blocked", "flex")
PLACEMENTS = ("none", "post_ln", "pre_ln", "peri", "mix", "lns", "ngpt")
#: placements whose rule is built around a normalisation (``norm="none"`` is refused)
NORMED_PLACEMENTS = ("peri", "mix", "lns", "ngpt")
DYT_ALPHA = 0.5  # Zhu et al. 2025, alpha_0 of non-LLM models
ALPHA_NGPT = 0.05  # Loshchilov et al. 2024, alpha_init of the eigen learning rates


@dataclass(frozen=True)
class BlockConfig:
    """One layer of the simulated network; each field's update rule and paper are in
    docs/dynamics.md ("Update rules", "Normalisations").

    Attributes
    ----------
    norm : "none" | "sphere" | "layernorm" | "rmsnorm" | "dyt"
        ``sphere``: rows to the unit sphere (SA-LN, spec.md §2); ``dyt``: ``tanh(dyt_alpha x)``.
        No affine parameters.
    placement : "none" | "post_ln" | "pre_ln" | "peri" | "mix" | "lns" | "ngpt"
        Where the norm sits around SA (and the MLP); ``"none"``: ``X <- norm(SA(X))``, no residual.
    alpha : float or None
        Skip weight; None: the placement's own (:func:`default_alpha`), stored resolved.
    attention : "softmax" | "uniform" | "sink:b=B" | "offbyone" | "sigmoid[:bias=B]" | "diff:lambda=L"
        ``uniform``: ``W_Q = W_K = 0``; the others: :mod:`rankcollapse.dynamics.operators`
        (stored as the canonical spec).
    n_heads, out_proj : heads (dividing ``d``); multiply the joined heads by ``W_O``.
    mlp, mlp_ratio : add the sublayer ``GELU(X W_1) W_2`` of width ``mlp_ratio * d``.
    final_norm : apply ``norm`` after the last layer (reported separately).
    eps : epsilon of layernorm, rmsnorm and ``headwise_rmsnorm``.
    mix_layers : ``mix``: the number of leading post-LN layers (required there only).
    alpha_ngpt : ``ngpt``: the step of nGPT's eq. 10 (default 0.05).
    dyt_alpha : ``dyt``: the slope ``alpha`` (default 0.5).
    qk_norm, qk_norm_scale : unit query and key rows, scores ``g q^ k^T`` with ``g =
        qk_norm_scale`` (None: ``log2(N^2 - N)``).
    headwise_rmsnorm : each head's output row divided by its RMS before ``W_O``.

    Raises ``ConfigError``: an unknown value or a combination docs/dynamics.md lists as refused
    (e.g. ``peri`` with ``norm="none"``, a setting of a placement or norm the block does not use).
    """

    norm: str = "none"
    placement: str = "none"
    alpha: float | None = None
    attention: str = "softmax"
    n_heads: int = 1
    out_proj: bool = False
    mlp: bool = False
    mlp_ratio: int = 4
    final_norm: bool = False
    eps: float = 1e-5
    mix_layers: int | None = None
    alpha_ngpt: float = ALPHA_NGPT
    dyt_alpha: float = DYT_ALPHA
    qk_norm: bool = False
    qk_norm_scale: float | None = None
    headwise_rmsnorm: bool = False

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ConfigError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.alpha is None:
            object.__setattr__(self, "alpha", default_alpha(self.placement))
        object.__setattr__(self, "attention", parse_attention(self.attention).spec)
        if self.placement == "none" and self.alpha != 0:
            raise ConfigError("placement 'none' has no skip connection: use post_ln or pre_ln with alpha")
        if self.placement == "none" and self.mlp:
            raise ConfigError("the MLP sublayer needs a residual placement (post_ln, pre_ln, peri, mix, lns, ngpt)")
        for name in ("n_heads", "mlp_ratio"):
            check_int(getattr(self, name), name, low=1)
        for name in ("out_proj", "mlp", "final_norm", "headwise_rmsnorm", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_float(self.alpha, "alpha")
        check_float(self.eps, "eps", low=0, strict_low=True)
        p = self.placement
        if p in NORMED_PLACEMENTS and self.norm == "none":
            raise ConfigError(f"placement {p!r} places a normalisation: give norm (sphere, layernorm, rmsnorm, dyt)")
        if p == "ngpt" and self.norm != "sphere":
            raise ConfigError(f"placement 'ngpt' keeps tokens on the unit sphere: it needs norm 'sphere', "
                              f"got {self.norm!r}")
        if p == "ngpt" and self.alpha != 1:
            raise ConfigError("placement 'ngpt' takes its step from alpha_ngpt; leave alpha at 1")
        if p == "mix":
            if self.mix_layers is None:
                raise ConfigError("placement 'mix' needs mix_layers: the number of leading post-LN layers "
                                  "(Mix-LN uses floor(0.25 * depth))")
            check_int(self.mix_layers, "mix_layers", low=0)
        elif self.mix_layers is not None:
            raise ConfigError(f"mix_layers is a setting of placement 'mix', not {p!r}")
        check_float(self.alpha_ngpt, "alpha_ngpt", low=0, strict_low=True)
        if p != "ngpt" and self.alpha_ngpt != ALPHA_NGPT:
            raise ConfigError(f"alpha_ngpt is a setting of placement 'ngpt', not {p!r}")
        check_float(self.dyt_alpha, "dyt_alpha", low=0, strict_low=True)
        if self.norm != "dyt" and self.dyt_alpha != DYT_ALPHA:
            raise ConfigError(f"dyt_alpha is a setting of norm 'dyt', not {self.norm!r}")
        if self.qk_norm and self.attention == "uniform":
            raise ConfigError("qk_norm acts on queries and keys; uniform attention has none")
        if self.qk_norm_scale is not None:
            if not self.qk_norm:
                raise ConfigError("is a setting of the query-key normalisation: turn it on as well", argument="qk_norm_scale")
            check_float(self.qk_norm_scale, "qk_norm_scale", low=0, strict_low=True)

    def to_dict(self) -> dict:
        return asdict(self)


def default_alpha(placement: str) -> float:
    """The skip weight a placement has unless told otherwise: 0 for ``none``, else 1."""
    return 0.0 if placement == "none" else 1.0


VARIANTS: dict[str, BlockConfig] = {
    "pure": BlockConfig(),  # X <- A X W_V
    "sphere": BlockConfig(norm="sphere"),  # X <- D A X W_V (rows to the unit sphere, spec.md §2)
    "layernorm": BlockConfig(norm="layernorm"),  # X <- LayerNorm(A X W_V), no affine, no skip
    "skip": BlockConfig(placement="post_ln"),  # X <- X + A X W_V
    "post_ln": BlockConfig(norm="layernorm", placement="post_ln"),  # X <- LayerNorm(X + A X W_V), no affine
}


def variant_name(cfg: BlockConfig) -> str | None:
    """The preset whose update rule ``cfg`` has (the head layout aside), or None."""
    rule = replace(cfg, n_heads=1, out_proj=False)
    return next((name for name, preset in VARIANTS.items() if preset == rule), None)


def resolve_variant(variant: str | BlockConfig, **overrides) -> BlockConfig:
    """The :class:`BlockConfig` of a variant name or config, with ``overrides``: a ``placement``
    override without ``alpha`` moves a default skip weight to the new placement's default
    (:func:`default_alpha`); a non-default skip weight is kept. Raises ``ConfigError``: unknown
    variant name or invalid override."""
    if isinstance(variant, BlockConfig):
        cfg = variant
    elif isinstance(variant, str) and variant in VARIANTS:
        cfg = VARIANTS[variant]
    else:
        raise ConfigError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)} or pass a BlockConfig")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "placement" in overrides and "alpha" not in overrides and cfg.alpha == default_alpha(cfg.placement):
        overrides["alpha"] = None  # the new placement's own
    try:
        return replace(cfg, **overrides) if overrides else cfg
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc


@dataclass(frozen=True)
class RunConfig:
    """How :func:`rankcollapse.dynamics.simulate` runs the network (what it is: :class:`BlockConfig`).

    Attributes
    ----------
    depth : layers run, ``>= 1``.
    seed : weight seed ``>= 0`` (:func:`rankcollapse.dynamics.weights.generator`).
    dtype : torch.float32, torch.float64 or None (X0's when float32/float64, else float32).
    device : torch device, str or None (X0's).
    backend : "auto" | "dense" | "blocked" | "flex" (:func:`~rankcollapse.dynamics.simulate`).
    block_size : query rows per block of the windowed kernel.
    record_states, record_epsilon, record_attention : keep X(t), ε(t), A(t).
    progress : a progress bar over layers on stderr; None: only on a terminal.
    max_memory : bytes (or ``"8GiB"``) each part of the run may use; None: half the physical memory.

    Raises ``ConfigError``: ``depth``, ``block_size`` < 1, ``seed`` < 0 (or not integers), an
    unknown ``backend``.
    """

    depth: int
    seed: int = 0
    dtype: Any = None
    device: Any = None
    backend: str = "auto"
    block_size: int = 64
    record_states: bool = False
    record_epsilon: bool = False
    record_attention: bool = False
    progress: bool | None = None
    max_memory: int | str | None = None

    def __post_init__(self) -> None:
        for name, low in (("depth", 1), ("seed", 0), ("block_size", 1)):
            object.__setattr__(self, name, check_int(getattr(self, name), name, low=low))
        if self.backend not in BACKENDS:
            raise ConfigError(f"must be one of {BACKENDS}, got {self.backend!r}", argument="backend")
