"""The weights of one attention layer, apart from :mod:`.weights` so that it and
:mod:`.pretrained` do not import each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

_FUSED = ("W_QKV", "W_MV")  # rebuilt by LayerWeights.to, not cast


@dataclass
class LayerWeights:
    """Attention (and optional MLP) weights of one layer.

    Shapes: ``W_Q`` ``(d, H d_k)``, ``W_K`` ``(d, H_kv d_k)``, ``W_V`` ``(d, H_kv d_v)``,
    ``W_O`` ``(H d_v, d)`` or None, biases ``(out,)`` or None. ``scale`` multiplies ``q k^T``
    (None: the run's ``1/sqrt(d_qk)``); ``rope_inv_freq`` ``(d_k/2,)`` turns on RoPE;
    ``position_bias(n) -> (H, n, n)`` is added to the scores (T5); ``W_1 (d, m)``, ``W_2 (m, d)``
    give the MLP ``GELU(x W_1 + b_1) W_2 + b_2``.
    """

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor | None = None
    b_Q: torch.Tensor | None = None
    b_K: torch.Tensor | None = None
    b_V: torch.Tensor | None = None
    b_O: torch.Tensor | None = None
    n_heads: int = 1
    n_kv_heads: int | None = None
    scale: float | None = None
    rope_inv_freq: torch.Tensor | None = None
    rope_scaling: float = 1.0
    position_bias: Callable[[int], torch.Tensor] | None = None
    W_1: torch.Tensor | None = None
    b_1: torch.Tensor | None = None
    W_2: torch.Tensor | None = None
    b_2: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)
    W_QKV: torch.Tensor | None = field(default=None, repr=False)
    W_MV: torch.Tensor | None = field(default=None, repr=False)
    W_QK_norm1: float | None = field(default=None, repr=False)

    @property
    def d_model(self) -> int:
        return self.W_Q.shape[0]

    def to(self, dtype: torch.dtype, device: torch.device | str | None) -> "LayerWeights":
        """Copy cast to ``dtype`` on ``device``, with the fused projections the layer allows:
        ``W_MV = [W_Q W_K^T | W_V]`` for one head with ``d_k >= d`` (the product formed in the
        source precision, its induced 1-norm ``W_QK_norm1`` bounding the scores), else
        ``W_QKV = [W_Q | W_K | W_V]``."""
        out = {}
        for name, value in self.__dict__.items():
            is_float = isinstance(value, torch.Tensor) and value.is_floating_point() and name not in _FUSED
            out[name] = value.to(device=device, dtype=dtype) if is_float else value
        lw = LayerWeights(**out)
        lw.W_MV = lw.W_QKV = lw.W_QK_norm1 = None
        plain = all(getattr(lw, b) is None for b in ("b_Q", "b_K", "b_V")) and lw.rope_inv_freq is None
        if not plain or lw.n_kv_heads not in (None, lw.n_heads) or lw.W_Q.shape != lw.W_K.shape:
            return lw
        if lw.n_heads == 1 and lw.W_Q.shape[1] >= lw.W_Q.shape[0]:
            if self.W_MV is not None:  # already fused: one cast
                lw.W_MV, lw.W_QK_norm1 = self.W_MV.to(device=device, dtype=dtype), self.W_QK_norm1
                return lw
            W_QK = self.W_Q @ self.W_K.T  # source precision
            lw.W_QK_norm1 = float(W_QK.abs().sum(dim=0).amax())  # max |x W_QK| <= max|x| * this
            lw.W_MV = torch.cat((W_QK, self.W_V), dim=1).to(device=device, dtype=dtype)
        elif lw.W_Q.shape == lw.W_V.shape:
            lw.W_QKV = torch.cat((lw.W_Q, lw.W_K, lw.W_V), dim=1)
        return lw
