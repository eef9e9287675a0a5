"""Attention operators whose rows need not sum to one (sinks, off-by-one, sigmoid, differential):
maps of the scaled scores ``S = scale * Q K^T`` and the mask to weights ``A``, dense path only.
Formulas: docs/dynamics.md ("Update rules"); theory: docs/theory.md ("Attention that is not
row-stochastic").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._validate import Key, Spec
from ..errors import ConfigError

if TYPE_CHECKING:  # torch is imported where weights are computed: parsing stays light
    import torch

#: kind -> the keys of its spec
_KEYS = {"softmax": (), "uniform": (), "sink": (Key("b"),), "offbyone": (), "sigmoid": (Key("bias", default=None),),
         "diff": (Key("lambda"),)}
KINDS = tuple(_KEYS)


@dataclass(frozen=True)
class AttentionOperator:
    """A parsed attention operator: ``kind`` (:data:`KINDS`), the sink logit ``b`` (0 for
    ``offbyone``), the sigmoid ``bias`` (None: ``-log N``), differential attention's ``lam``."""

    kind: str
    b: float | None = None
    bias: float | None = None
    lam: float | None = None

    @property
    def row_stochastic(self) -> bool:
        """Whether every row of ``A`` sums to 1 (the assumption of Theorem 1)."""
        return self.kind in ("softmax", "uniform")

    @property
    def spec(self) -> str:
        """The canonical spec string (``parse_attention(op.spec) == op``)."""
        values = {"b": self.b, "bias": self.bias, "lambda": self.lam}
        given = {k.name: f"{values[k.name]:g}" for k in _KEYS[self.kind] if values[k.name] is not None}
        return str(Spec(self.kind, given))


def parse_attention(spec: str | AttentionOperator) -> AttentionOperator:
    """Parse ``softmax | uniform | sink:b=B | offbyone | sigmoid[:bias=B] | diff:lambda=L``. Raises
    ``ConfigError``: unknown kind, unknown or missing parameter, or a value that is not a finite
    number."""
    if isinstance(spec, AttentionOperator):
        return spec
    parsed = Spec.parse(spec, "attention", names=_KEYS)
    if parsed.name == "offbyone":
        return AttentionOperator("sink", b=0.0)
    p = parsed.params
    return AttentionOperator(parsed.name, b=p.get("b"), bias=p.get("bias"), lam=p.get("lambda"))


def operator_weights(Q: torch.Tensor, K: torch.Tensor, mask: torch.Tensor, op: AttentionOperator, *,
                     scale: float, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention weights ``A`` ``(B, H, N, N)`` of ``op`` in ``Q.dtype`` from Q, K ``(B, H, N, d_k)``,
    a bool mask ``(N, N)`` and ``bias`` ``(H, N, N)`` or None added to the scaled scores; scores
    that may overflow are formed in float64. Raises ``ConfigError``: ``diff`` with an odd per-head
    query/key width."""
    import torch

    from .attention import masked_softmax, scores_may_overflow

    if op.kind == "diff":
        d_k = Q.shape[-1]
        if d_k % 2:
            raise ConfigError(f"attention 'diff' splits each head's queries and keys in two halves; d_k = {d_k} is odd")
        h = d_k // 2
        A1 = operator_weights(Q[..., :h], K[..., :h], mask, AttentionOperator("softmax"), scale=scale, bias=bias)
        A2 = operator_weights(Q[..., h:], K[..., h:], mask, AttentionOperator("softmax"), scale=scale, bias=bias)
        return A1 - op.lam * A2
    work = torch.float64 if scores_may_overflow(Q, K, scale, bias) else Q.dtype
    S = (Q.to(work) @ K.to(work).transpose(-1, -2)) * scale
    if bias is not None:
        S = S + bias.to(work)
    if op.kind == "sink":
        return _sink_softmax(S, mask, op.b).to(Q.dtype)
    if op.kind == "sigmoid":
        b = -math.log(S.shape[-1]) if op.bias is None else op.bias
        return torch.sigmoid(S + b).masked_fill(~mask, 0.0).to(Q.dtype)
    return masked_softmax(S, mask).to(Q.dtype)


def _sink_softmax(S: torch.Tensor, mask: torch.Tensor, b: float) -> torch.Tensor:
    """``exp(S_ij) / (exp(b) + sum_k exp(S_ik))`` over allowed ``j``, max-subtracted with ``b`` included."""
    import torch

    info = torch.finfo(S.dtype)
    s = S.clamp(info.min, info.max).masked_fill(~mask, info.min)
    m = torch.maximum(s.amax(dim=-1, keepdim=True), torch.tensor(b, dtype=S.dtype, device=S.device))
    e = torch.exp(s - m).masked_fill(~mask, 0.0)
    return e / (e.sum(dim=-1, keepdim=True) + torch.exp(b - m))


def row_mass_quantiles(A: torch.Tensor, q=(0.05, 0.5, 0.95)) -> torch.Tensor:
    """Quantiles over queries of the row-mass deficit ``1 - sum_j A_ij``: ``(B, H, len(q))``
    float64 from ``A`` ``(B, H, N, N)``."""
    import torch

    deficit = 1.0 - A.to(torch.float64).sum(-1)  # (B, H, N)
    return torch.quantile(deficit, torch.tensor(q, dtype=torch.float64, device=A.device), dim=-1).permute(1, 2, 0)


__all__ = ["AttentionOperator", "KINDS", "operator_weights", "parse_attention", "row_mass_quantiles"]
