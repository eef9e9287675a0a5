"""Alignment of tokens with the principal eigenvector of a layer's value-output map.

A token ``x`` maps to ``x M``, ``M = W_V W_O``; Li and Altafini (arXiv 2605.25619) read a
layer as a power-method step on ``F = M^T``: tokens tilt toward its principal eigenvector
``v_1`` (of the largest modulus, the largest real one among ties; for a complex pair the
real plane it spans) at the rate ``|lambda_2 / lambda_1|`` per layer.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..errors import MetricError

#: Two eigenvalues whose moduli differ by less than this fraction of the largest share it.
TIE = 1e-9


def value_output_map(layer: Any) -> torch.Tensor:
    """``M = W_V W_O = sum_h W_V^h W_O^h`` ``(d, d)`` in float64 of one layer's weights
    (biases left out; ``M = W_V`` without ``W_O``). ``layer``: ``W_V`` ``(d, H_kv d_v)``, ``W_O``
    ``(H d_v, d)`` or None, ``n_heads``, ``n_kv_heads``, as :class:`rankcollapse.dynamics.LayerWeights`;
    :class:`MetricError` for shapes that do not make a square map.
    """
    W_V = layer.W_V.detach().to("cpu", torch.float64)
    W_O = getattr(layer, "W_O", None)
    if W_O is None:
        M = W_V
    else:
        W_O = W_O.detach().to("cpu", torch.float64)
        heads = int(getattr(layer, "n_heads", 1) or 1)
        kv = int(getattr(layer, "n_kv_heads", None) or heads)
        if W_V.shape[1] % kv or W_O.shape[0] % heads or W_V.shape[1] // kv != W_O.shape[0] // heads:
            raise MetricError(f"W_V {tuple(W_V.shape)} with {kv} key/value heads and W_O {tuple(W_O.shape)} with "
                              f"{heads} heads have no common head width")
        d_v = W_V.shape[1] // kv
        Vh = W_V.reshape(W_V.shape[0], kv, d_v).repeat_interleave(heads // kv, dim=1)  # (d, H, d_v)
        M = torch.einsum("dhk,hke->de", Vh, W_O.reshape(heads, d_v, -1))
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise MetricError(f"the value-output map of a layer must be square (d, d), got {tuple(M.shape)}")
    return M


def spectral_radius(M: torch.Tensor) -> float:
    """``rho(M) = max |lambda_i(M)|`` of a square matrix (float64 eigenvalues)."""
    return float(torch.linalg.eigvals(torch.as_tensor(M).double()).abs().max())


def principal_eigenvector(M: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(v_1, |lambda_2| / |lambda_1|)`` of ``F = M^T`` for the row-convention map ``M`` ``(d, d)``.

    Returns
    -------
    v_1 : float64 ``(1, d)``, a unit vector whose largest entry is positive, or ``(2, d)``,
        an orthonormal basis of the plane of a complex leading pair.
    ratio : ``|lambda_2| / |lambda_1|`` over the eigenvalues outside ``v_1`` (0 if none).

    Raises :class:`MetricError` for ``M`` not square, not finite or zero.
    """
    M = torch.as_tensor(M).detach().to("cpu", torch.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] == 0:
        raise MetricError(f"v1 needs a square (d, d) matrix, got shape {tuple(M.shape)}")
    if not bool(torch.isfinite(M).all()):
        raise MetricError("v1 of a matrix with NaN or Inf entries is undefined")
    lam, vec = torch.linalg.eig(M.T)  # right eigenvectors of F = M^T
    mod = lam.abs()
    top = float(mod.max())
    if top == 0:
        raise MetricError("every eigenvalue of W_O W_V is 0: v1 is undefined")
    tied = torch.nonzero(mod >= top * (1 - TIE)).flatten()
    k = int(tied[torch.argmax(lam.real[tied] + TIE * top * (lam.imag[tied] > 0))])
    if abs(float(lam[k].imag)) > TIE * top:  # a complex pair: the plane of Re v, Im v, the conjugate's too
        V = torch.linalg.qr(torch.stack([vec[:, k].real, vec[:, k].imag], dim=1)).Q.T
        conj = int(torch.argmin((lam - lam[k].conj()).abs()))
        others = [j for j in range(len(lam)) if j not in (k, conj)]
    else:
        v = vec[:, k].real
        v = v / torch.linalg.vector_norm(v)
        V = (v if float(v[torch.argmax(v.abs())]) > 0 else -v)[None]
        others = [j for j in range(len(lam)) if j != k]
    return V, (float(mod[others].max()) / top if others else 0.0)


def v1_alignment(X, v1: torch.Tensor, *, padding_mask=None) -> torch.Tensor:
    """``(1/N) sum_i ||P x_i|| / ||x_i||`` in ``[0, 1]`` per sample over its real, non-zero
    tokens, ``P`` the projection onto the span of ``v1`` (about ``sqrt(2 / (pi d))`` for
    random directions and a line).

    ``X`` ``(N, d)`` or ``(B, N, d)`` -> float64 ``()`` or ``(B,)``; ``v1`` ``(d,)`` or ``(k, d)``
    orthonormal rows (:func:`principal_eigenvector`); ``padding_mask`` bool, True = real
    token. :class:`MetricError` for widths that differ, X not 2-D/3-D, or a sample without a
    non-zero real token.
    """
    X = torch.as_tensor(X)
    V = torch.as_tensor(v1).to(torch.float64)
    V = V[None] if V.ndim == 1 else V
    if X.ndim not in (2, 3) or V.ndim != 2 or X.shape[-1] != V.shape[-1]:
        raise MetricError(f"v1_alignment needs tokens (N, d) or (B, N, d) of the width of v1 ({V.shape[-1]}), "
                          f"got {tuple(X.shape)}")
    batched = X.ndim == 3
    Xb = (X if batched else X.unsqueeze(0)).double()
    peak = Xb.abs().amax(dim=-1, keepdim=True)
    Y = Xb / torch.where(peak > 0, peak, 1.0)  # largest entry 1: no over- or underflow
    norms = torch.linalg.vector_norm(Y, dim=-1)  # (B, N)
    keep = norms > 0
    if padding_mask is not None:
        keep = keep & torch.as_tensor(padding_mask, device=keep.device).bool().reshape(keep.shape)
    if not bool(keep.any(dim=-1).all()):
        raise MetricError("v1_alignment: a sample has no non-zero real token (no direction)")
    proj = torch.linalg.vector_norm(Y @ V.to(Y.device).T, dim=-1)  # (B, N): ||P y_i||
    cos = (proj / torch.where(keep, norms, 1.0)).clamp_max(1.0)
    out = (cos * keep).sum(dim=-1) / keep.sum(dim=-1)
    return out if batched else out[0]


def layer_v1_alignment(X, layer: Any) -> torch.Tensor:
    """:func:`v1_alignment` of ``X`` with ``v_1`` of ``layer``'s :func:`value_output_map`."""
    v1, _ = principal_eigenvector(value_output_map(layer))
    return v1_alignment(X, v1)


def random_alignment(d_model: int) -> float:
    """``E |<u, v>| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))`` for ``u`` uniform on ``S^(d-1)``
    and a fixed unit ``v``: the alignment of tokens in random directions."""
    return math.exp(math.lgamma(d_model / 2) - math.lgamma((d_model + 1) / 2)) / math.sqrt(math.pi)
