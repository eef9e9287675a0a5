"""Configuration of the simulated network: the layer (:class:`BlockConfig`:
normalisation, placement, skip, MLP) and the run (:class:`RunConfig`: depth, seed,
precision, device, attention backend, what is recorded).

The named variants of spec.md §2 (and real LayerNorm beside them) are presets of
:class:`BlockConfig`; names say what the block does, and result tables record them:

==================  ===============================================================
variant             update rule
==================  ===============================================================
``pure``            ``X <- A X W_V``
``sphere``          ``X <- D A X W_V``: rows to the unit sphere (SA-LN of spec.md §2;
                    not LayerNorm)
``layernorm``       ``X <- LayerNorm(A X W_V)``: real LayerNorm (centre and scale,
                    rows at radius sqrt(d)), no skip
``skip``            ``X <- X + A X W_V``
``post_ln``         ``X <- LayerNorm(X + A X W_V)`` (real LayerNorm, BERT-style)
==================  ===============================================================

``post_ln`` is one concept under both names: the variant ``post_ln`` is exactly the block
with placement ``post_ln`` and ``norm="layernorm"`` (the placement says where the norm
sits, after the residual sum; the norm says which one; ``skip`` is that placement
without a norm).

Placements: ``none`` (no residual: ``X <- norm(SA(X))``), ``post_ln``, ``pre_ln``,
``peri``, ``mix``, ``lns``, ``ngpt`` (:class:`BlockConfig`; docs/dynamics.md,
"Normalisations"). A
post-LN or pre-LN block has its residual (skip weight ``alpha = 1``) unless ``alpha`` is
given: ``BlockConfig(placement="post_ln")`` is ``X <- norm(X + SA(X))``, and
``alpha=0`` turns the skip off explicitly. Overriding the placement of a preset with
:func:`resolve_variant` moves a default ``alpha`` along (``pure`` with placement
``pre_ln`` is ``X <- X + SA(norm(X))``); an explicit ``alpha`` is kept.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .._validate import check_float, check_int
from ..errors import ConfigError

NORMS = ("none", "sphere", "layernorm", "rmsnorm", "dyt")
BACKENDS = ("auto", "dense", "blocked", "flex")
PLACEMENTS = ("none", "post_ln", "pre_ln", "peri", "mix", "lns", "ngpt")
#: placements whose rule is built around a normalisation (``norm="none"`` is refused)
NORMED_PLACEMENTS = ("peri", "mix", "lns", "ngpt")
DYT_ALPHA = 0.5  # Zhu et al. 2025, alpha_0 of non-LLM models
ALPHA_NGPT = 0.05  # Loshchilov et al. 2024, alpha_init of the eigen learning rates


@dataclass(frozen=True)
class BlockConfig:
    """One layer of the simulated network (all fields keyword-only in spirit).

    Update rules (row-vector convention, ``SA(X) = A X W_V`` or its multi-head form;
    ``l = 1, 2, ...`` the layer index, ``norm`` the normalisation of ``norm``):

    - ``placement="none"``: ``X <- norm(SA(X))`` (spec.md §2; no skip, ``alpha`` must be 0).
    - ``post_ln``, ``pre_ln``, ``peri``, ``mix``, ``lns`` have their residual: ``alpha``
      defaults to 1 there.
    - ``placement="post_ln"``: ``X <- norm(alpha X + SA(X))``; with MLP then
      ``X <- norm(alpha X + MLP(X))`` (BERT-style post-LN).
    - ``placement="pre_ln"``: ``X <- alpha X + SA(norm(X))``; with MLP then
      ``X <- alpha X + MLP(norm(X))`` (GPT-2/Llama-style pre-LN); ``final_norm`` applies
      ``norm`` once after the last layer.
    - ``placement="peri"`` (Peri-LN, Kim et al. 2025, eq. 3: ``y = x + Norm(Module(Norm(x)))``):
      ``X <- alpha X + norm(SA(norm(X)))``; with MLP then ``X <- alpha X + norm(MLP(norm(X)))``.
    - ``placement="mix"`` (Mix-LN, Li et al. 2024, §3): the ``post_ln`` rule in layers
      ``l <= mix_layers``, the ``pre_ln`` rule after (the paper takes ``mix_layers =
      floor(0.25 L)`` of ``L`` layers; here it is a required setting).
    - ``placement="lns"`` (LayerNorm scaling, Sun et al. 2025, "The Curse of Depth", eq. 8:
      ``h' = LN(h) / sqrt(l)``): ``X <- alpha X + SA(norm(X) / sqrt(l))``; with MLP then
      ``X <- alpha X + MLP(norm(X) / sqrt(l))``. ``final_norm`` is not scaled.
    - ``placement="ngpt"`` (nGPT, Loshchilov et al. 2024, eq. 10:
      ``h <- Norm(h + alpha_A (h_A - h))``, ``h_A = Norm(ATTN(h))``):
      ``X <- D(X + alpha_ngpt (D SA(X) - X))``, ``D`` rows to the unit sphere; with MLP then
      ``X <- D(X + alpha_ngpt (D MLP(X) - X))``. Needs ``norm="sphere"``; ``alpha`` stays 1
      (the step is ``alpha_ngpt``). The input ``X(0)`` is used as given (start on the
      sphere to follow the paper).
    - ``norm="dyt"`` (Dynamic Tanh, Zhu et al. 2025, eq. 1: ``DyT(x) = gamma tanh(alpha x) +
      beta``): the elementwise ``tanh(dyt_alpha x)`` in the norm's place, with ``gamma = 1``,
      ``beta = 0`` unless the layer weights carry an affine; no normalisation.
    - ``qk_norm=True`` (QK-norm, Henry et al. 2020, eq. 2, the cosine form of Dehghani et
      al. 2023): every query and key row is divided by its Euclidean norm (per head; a zero
      row stays zero) and the scores are ``g q^ k^T`` with ``g = qk_norm_scale``; ``qk_norm_scale=None``
      is Henry et al.'s initial ``g_0 = log2(N^2 - N)`` (N tokens; 1 when N = 1). ``g``
      replaces ``1/sqrt(d_qk)`` and a layer's own scale. It combines with every norm and
      placement (it acts inside SA); not with uniform attention.
    - ``headwise_rmsnorm=True`` (head-wise RMSNorm, Li et al. 2026, "The Structural Origin
      of Attention Sink", arXiv 2605.06611): each head's output row ``o_i = sum_j a_ij v_j``
      is divided by its RMS, ``o_i / sqrt(mean(o_i^2) + eps)`` (no gain), before the heads
      are joined and ``W_O`` applied; the first query's output (one value) and a later
      query's (an average of many) then have the same RMS. It combines with every norm,
      placement and attention (it acts inside SA).

    Combinations refused (``ConfigError``): ``peri``, ``mix``, ``lns``, ``ngpt`` with
    ``norm="none"`` (their rule is about a norm); ``ngpt`` with a norm other than ``sphere``
    or ``alpha != 1``; ``mix`` without ``mix_layers``; ``mix_layers``, a non-default
    ``alpha_ngpt``, ``dyt_alpha`` or ``qk_norm_scale`` where the block does not use them.

    Attributes
    ----------
    norm : "none" | "sphere" | "layernorm" | "rmsnorm" | "dyt"
        ``sphere`` puts every row on the unit sphere (SA-LN, spec.md §2); ``layernorm``
        centres and divides by the std (``eps``); ``rmsnorm`` divides by the RMS; ``dyt``
        is ``tanh(dyt_alpha x)``. Affine parameters are applied only when layer weights
        carry them.
    placement : "none" | "post_ln" | "pre_ln" | "peri" | "mix" | "lns" | "ngpt"
        ``"none"``: no residual.
    alpha : float or None
        Skip weight (0 = no skip connection). None (default) means the placement's own:
        0 for ``none``, 1 for the others; the stored value is always the
        number that runs (``to_dict`` records it).
    attention : "softmax" | "uniform" | "sink:b=B" | "offbyone" | "sigmoid[:bias=B]" | "diff:lambda=L"
        ``uniform`` is attention with ``W_Q = W_K = 0``: uniform over each row of the mask.
        The others are not row-stochastic (:mod:`rankcollapse.dynamics.operators`, which
        gives each formula); the stored value is the canonical spec (``offbyone`` is
        ``sink:b=0``).
    n_heads : int
        Heads; ``d`` must be divisible by it.
    out_proj : bool
        Multiply the concatenated heads by ``W_O`` (drawn from the value family).
    mlp : bool
        Add the MLP sublayer ``GELU(X W_1) W_2`` (width ``mlp_ratio * d``).
    final_norm : bool
        Apply ``norm`` after the last layer (reported separately).
    eps : float
        Epsilon of layernorm/rmsnorm.
    mix_layers : int or None
        ``mix``: the number of leading post-LN layers (>= 0); required there, refused elsewhere.
    alpha_ngpt : float
        ``ngpt``: the step ``alpha`` of eq. 10 (default 0.05, the paper's ``alpha_init``).
    dyt_alpha : float
        ``dyt``: the slope ``alpha`` of ``tanh(alpha x)`` (default 0.5, the paper's ``alpha_0``).
    qk_norm : bool
        Normalise queries and keys (see above).
    qk_norm_scale : float or None
        ``qk_norm``: the score scale ``g`` (None: ``log2(N^2 - N)``).
    headwise_rmsnorm : bool
        RMSNorm of each head's output (see above; ``eps`` is its epsilon).
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
        if self.alpha is None:  # a residual placement has its residual unless turned off
            object.__setattr__(self, "alpha", default_alpha(self.placement))
        from .operators import parse_attention

        object.__setattr__(self, "attention", parse_attention(self.attention).spec)
        if self.placement == "none" and self.alpha != 0:
            raise ConfigError("placement 'none' has no skip connection: use post_ln or pre_ln with alpha")
        if self.placement == "none" and self.mlp:
            raise ConfigError("the MLP sublayer needs a residual placement (post_ln, pre_ln, peri, mix, lns, ngpt)")
        for name in ("n_heads", "mlp_ratio"):
            check_int(getattr(self, name), name, low=1)
        for name in ("out_proj", "mlp", "final_norm", "headwise_rmsnorm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        check_float(self.alpha, "alpha")
        check_float(self.eps, "eps", low=0, strict_low=True)
        self._check_normalisation()

    def _check_normalisation(self) -> None:
        """The combinations of the class docstring that are refused."""
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
        if not isinstance(self.qk_norm, bool):
            raise ConfigError(f"qk_norm must be True or False, got {self.qk_norm!r}")
        if self.qk_norm and self.attention == "uniform":
            raise ConfigError("qk_norm acts on queries and keys; uniform attention has none")
        if self.qk_norm_scale is not None:
            if not self.qk_norm:
                raise ConfigError("is a setting of the query-key normalisation: turn it on as well", argument="qk_norm_scale")
            check_float(self.qk_norm_scale, "qk_norm_scale", low=0, strict_low=True)

    def to_dict(self) -> dict:
        return asdict(self)



def default_alpha(placement: str) -> float:
    """The skip weight a placement has unless told otherwise: 0 for ``none`` (no
    residual), 1 for the others (``ngpt``: its residual is built into the step)."""
    return 0.0 if placement == "none" else 1.0


VARIANTS: dict[str, BlockConfig] = {
    # X <- A X W_V
    "pure": BlockConfig(),
    # X <- D A X W_V (rows to the unit sphere, spec.md §2)
    "sphere": BlockConfig(norm="sphere"),
    # X <- LayerNorm(A X W_V), no affine, no skip
    "layernorm": BlockConfig(norm="layernorm"),
    # X <- X + A X W_V
    "skip": BlockConfig(placement="post_ln"),
    # X <- LayerNorm(X + A X W_V), no affine
    "post_ln": BlockConfig(norm="layernorm", placement="post_ln"),
}


def variant_name(cfg: BlockConfig) -> str | None:
    """The preset name of ``cfg`` (e.g. ``"sphere"`` with its norm overridden to
    layernorm is ``"layernorm"``), or None when no preset equals it. The head layout
    (``n_heads``, ``out_proj``) is not part of a preset's update rule: a 12-head
    ``pure`` block is ``"pure"``."""
    rule = replace(cfg, n_heads=1, out_proj=False)
    return next((name for name, preset in VARIANTS.items() if preset == rule), None)


def resolve_variant(variant: str | BlockConfig, **overrides) -> BlockConfig:
    """Return the :class:`BlockConfig` of a variant name or config, with ``overrides``.

    A ``placement`` override without ``alpha`` moves a default skip weight to the new
    placement's default (:func:`default_alpha`: ``pure`` with ``placement="pre_ln"``
    gets its residual, ``skip`` with ``placement="none"`` loses it); a skip weight that
    differs from its placement's default is kept. (``dataclasses.replace`` keeps
    ``alpha`` as it is.)

    Raises
    ------
    ConfigError
        Unknown variant name or invalid override.
    """
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
    """How :func:`rankcollapse.dynamics.simulate` runs the network (not what the network
    is: that is :class:`BlockConfig`, the mask, ``d_qk`` and the weights).

    ``simulate(X0, "causal", block=BlockConfig(norm="sphere"), run=RunConfig(depth=64,
    seed=0, dtype=torch.float64))``: 64 layers of SA with rows put on the unit sphere, in
    float64, weights drawn from seed 0.

    Attributes
    ----------
    depth : int
        Layers run, ``T >= 1``.
    seed : int
        Weight seed ``>= 0`` (:func:`rankcollapse.dynamics.weights.generator`).
    dtype : torch.float32, torch.float64 or None
        Compute precision; None: X0's when it is float32/float64, else float32.
    device : torch device, str or None
        None: X0's device.
    backend : "auto" | "dense" | "blocked" | "flex"
        Attention kernel (:func:`~rankcollapse.dynamics.simulate` explains each).
    block_size : int
        Query rows per block of the windowed kernel.
    record_states, record_epsilon, record_attention : bool
        Keep X(t), ε(t) (smallest allowed attention entry per layer), A(t).
    progress : bool or None
        A progress bar over layers on stderr; None: only when stderr is a terminal.
    max_memory : int, str or None
        Bytes (or ``"8GiB"``) the attention may use; None: half the physical memory.

    Raises
    ------
    ConfigError
        ``depth`` < 1, ``seed`` < 0, ``block_size`` < 1 (or not integers), unknown ``backend``.
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
