"""One time-invariant self-attention system (mask, W_Q, W_K, W_V, d_qk) and its SA-LN step
``X ↦ D A X W_V`` (spec.md §2; ``D`` puts every row back on the unit sphere)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..dynamics.attention import attention_weights
from ..dynamics.config import BlockConfig
from ..dynamics.layer_weights import LayerWeights
from ..dynamics.single_head import single_head_layer
from ..masks import check_rows_allow_key, dense_mask
from .._validate import check_device, check_float, check_int, check_tensor_storage
from ..errors import ConfigError, MaskError

#: SA-LN ``X <- D A X W_V`` as a dynamics block
SA_LN = BlockConfig(norm="sphere", placement="none")


@dataclass(frozen=True)
class AttentionSystem:
    """A time-invariant single-head self-attention layer: bool ``mask`` ``(N, N)``, ``W_Q, W_K``
    ``(d, d_k)``, ``W_V`` ``(d, d)`` (row vectors: ``x ↦ x W_V``), temperature ``d_qk`` (spec.md §1)."""

    mask: torch.Tensor
    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    d_qk: float = 1.0

    def __post_init__(self) -> None:
        for name in ("mask", "W_Q", "W_K", "W_V"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise ConfigError(f"{name} must be a torch.Tensor (AttentionSystem.from_dict reads lists), "
                                  f"got {type(getattr(self, name)).__name__}")
        check_tensor_storage(self.mask, "mask", error=MaskError)  # sparse or meta: no entries to read
        for name in ("W_Q", "W_K", "W_V"):
            check_tensor_storage(getattr(self, name), name)
        m = self.mask
        if m.dtype != torch.bool or m.ndim != 2 or m.shape[0] != m.shape[1]:
            raise MaskError(f"mask must be a square bool matrix, got {tuple(m.shape)} {m.dtype}")
        check_rows_allow_key(m)
        d = self.W_V.shape[0]
        if self.W_V.shape != (d, d):
            raise ConfigError(f"W_V must be square (d, d), got {tuple(self.W_V.shape)}")
        for name in ("W_Q", "W_K"):
            w = getattr(self, name)
            if w.ndim != 2 or w.shape[0] != d:
                raise ConfigError(f"{name} must be (d={d}, d_k), got {tuple(w.shape)}")
        if self.W_Q.shape != self.W_K.shape:
            raise ConfigError(f"W_Q {tuple(self.W_Q.shape)} and W_K {tuple(self.W_K.shape)} differ")
        object.__setattr__(self, "d_qk", check_float(self.d_qk, "d_qk", low=0.0, strict_low=True))
        for name in ("W_Q", "W_K", "W_V"):
            if not bool(torch.isfinite(getattr(self, name)).all()):
                raise ConfigError(f"{name} has NaN or infinite entries")

    @property
    def n_tokens(self) -> int:
        return int(self.mask.shape[0])

    @property
    def dim(self) -> int:
        return int(self.W_V.shape[0])

    def to(self, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> "AttentionSystem":
        """Copy cast to ``dtype`` on ``device`` (ConfigError for a device not present here)."""
        device = None if device is None else check_device(device)
        W_Q, W_K, W_V = (w.to(dtype=dtype, device=device) for w in (self.W_Q, self.W_K, self.W_V))
        return AttentionSystem(self.mask.to(device=device), W_Q, W_K, W_V, self.d_qk)

    def attention(self, X: torch.Tensor) -> torch.Tensor:
        """``A(X)``, shape ``(N, N)`` or ``(B, N, N)``."""
        return attention_weights(X, self.mask, self.W_Q, self.W_K, d_qk=self.d_qk)

    def step(self, X: torch.Tensor, *, check: bool = True) -> torch.Tensor:
        """SA-LN step ``D A X W_V``. A zero row of ``A X W_V`` raises ConfigError with ``check``,
        else becomes NaN (:func:`rankcollapse.dynamics.layers.sphere`)."""
        weights = LayerWeights(self.W_Q, self.W_K, self.W_V)
        return single_head_layer(X, self.mask, weights, SA_LN, d_qk=self.d_qk, zero_rows="raise" if check else "nan",
                                 direct_sphere=True)[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with keys ``mask``, ``W_Q``, ``W_K``, ``W_V``, ``d_qk``."""
        return {"mask": self.mask.cpu().tolist(),
                **{k: getattr(self, k).detach().cpu().double().tolist() for k in ("W_Q", "W_K", "W_V")},
                "d_qk": float(self.d_qk)}

    @classmethod
    def from_dict(cls, obj: dict[str, Any], dtype: torch.dtype = torch.float64) -> "AttentionSystem":
        """Inverse of :meth:`to_dict` (schema: docs/theory.md, "System files"); ``mask`` may also be
        a spec string on ``n_tokens`` tokens (default ``W_V``'s size). Other keys are ignored.
        Raises ConfigError for a missing key or a malformed matrix, MaskError for a bad mask spec."""
        if not isinstance(obj, dict):
            raise ConfigError(f"system must be a JSON object with keys mask, W_Q, W_K, W_V, got {type(obj).__name__}")
        missing = [k for k in ("mask", "W_Q", "W_K", "W_V") if k not in obj]
        if missing:
            raise ConfigError(f"system is missing keys {missing}")
        try:
            mats = [torch.tensor(obj[k], dtype=dtype) for k in ("W_Q", "W_K", "W_V")]
            mask = _mask_of(obj, mats[2])
        except (MaskError, ConfigError):
            raise
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:  # ragged, non-numeric, > 64-bit
            raise ConfigError(f"malformed system matrix: {str(exc).splitlines()[0][:160]}") from None
        return cls(mask, *mats, d_qk=obj.get("d_qk", 1.0))


def _mask_of(obj: dict[str, Any], W_V: torch.Tensor) -> torch.Tensor:
    """The ``mask`` entry (a nested list or a spec string) as a bool tensor."""
    spec = obj["mask"]
    if not isinstance(spec, str):
        return torch.tensor(spec, dtype=torch.bool)
    n = obj.get("n_tokens", W_V.shape[0] if W_V.ndim == 2 else None)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"n_tokens must be a positive integer for mask spec {spec!r}, got {n!r}")
    return dense_mask(spec, n)


def as_system(system: Any) -> AttentionSystem:
    """``system`` in float64; ConfigError unless it is an :class:`AttentionSystem`."""
    if not isinstance(system, AttentionSystem):
        raise ConfigError(f"system must be an AttentionSystem (AttentionSystem.from_dict builds one), "
                          f"got {type(system).__name__}")
    return system.to(torch.float64)


def as_state(X: Any, system: AttentionSystem | None = None, name: str = "X") -> torch.Tensor:
    """``X`` as float64 token states ``(..., N, d)`` (``N, d`` those of ``system`` when given).
    Raises ConfigError for a non-real tensor or array, fewer than two dimensions, or another shape."""
    if isinstance(X, np.ndarray) and X.dtype.kind in "biuf":
        X = torch.from_numpy(np.ascontiguousarray(X))
    if not isinstance(X, torch.Tensor) or X.is_complex() or X.ndim < 2:
        got = f"shape {tuple(X.shape)}" if isinstance(X, torch.Tensor) else type(X).__name__
        raise ConfigError(f"{name} must be a real tensor of token states (N, d), got {got}")
    if system is not None and tuple(X.shape[-2:]) != (system.n_tokens, system.dim):
        raise ConfigError(f"{name} has shape {tuple(X.shape)}; the system's states are "
                          f"(N, d) = ({system.n_tokens}, {system.dim})")
    return X.to(torch.float64)


def causal_uniform_system(W_V: torch.Tensor, n_tokens: int) -> AttentionSystem:
    """Causal mask with ``W_Q = W_K = 0`` (``A[i, j] = 1/(i+1)``, ``j ≤ i``). Raises ConfigError
    for ``W_V`` not a ``(d, d)`` tensor or ``n_tokens`` not an integer >= 1."""
    n_tokens = check_int(n_tokens, "n_tokens", low=1)
    if not isinstance(W_V, torch.Tensor) or W_V.ndim != 2:
        raise ConfigError(f"W_V must be a (d, d) torch.Tensor, got {type(W_V).__name__}")
    d = W_V.shape[0]
    mask = torch.ones(n_tokens, n_tokens, dtype=torch.bool).tril()
    zeros = torch.zeros(d, 1, dtype=W_V.dtype)
    return AttentionSystem(mask, zeros, zeros.clone(), W_V, 1.0)


def fixed_point_residual(system: AttentionSystem, X: torch.Tensor) -> float:
    """``max |step(X) - X|`` (float64), the fixed-point error of an SA-LN state."""
    return float((system.step(X) - X).abs().max())
