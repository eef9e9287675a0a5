"""Weight families for the simulated network (docs/dynamics.md, "Default initialisation and
weight families"): matrices ``(d_in, d_out)``, ``x -> x W``, drawn in float64 on the CPU from
a generator seeded by ``(seed, layer, role)``. :data:`FAMILIES` is the one registry: ``name ->
fn(d_in, d_out, gen, params, batch, layer, role)`` returning float64 ``(*batch, d_in, d_out)``
(``batch = (n,)``: layers ``layer .. layer + n - 1`` one after another from ``gen``).
"""

from __future__ import annotations

import concurrent.futures
import math
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import torch

from .._validate import Key, Spec, check_tensor_storage
from ..errors import ConfigError
from .layer_weights import LayerWeights  # noqa: F401  (its home; weights is its public path)

ROLES = {"W_Q": 1, "W_K": 2, "W_V": 3, "W_O": 4, "W_1": 5, "W_2": 6}
SPREADS = ("std", "noise", "gain")
_SQUARE = ("orthogonal", "identity", "scaled_identity", "spd", "near_identity", "constructed")


def parse_family(spec: str) -> tuple[str, dict[str, float]]:
    """Split ``NAME:key=value,...`` into the name and float parameters. Raises ``ConfigError``:
    unknown family, malformed or unknown parameter, a negative spread (:data:`SPREADS`)."""
    parsed = Spec.parse(spec, "weight family", names={n: tuple(Key(k, default=None) for k in keys)
                                                      for n, keys in FAMILY_PARAMS.items()})
    for key in SPREADS:
        if parsed.params.get(key) is not None and parsed.params[key] < 0:
            raise ConfigError(f"weight family {str(parsed)!r}: {key} is a spread and must be >= 0, got "
                              f"{parsed.params[key]}")
    return parsed.name, parsed.params


def generator(seed: int, layer: int, role: str) -> torch.Generator:
    """CPU generator for weight ``role`` of ``layer`` under ``seed`` (independent streams)."""
    state = np.random.SeedSequence([int(seed), int(layer), ROLES[role]]).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(state[0] % (2**63 - 1)))


def haar_orthogonal(d: int, gen: torch.Generator, batch: tuple[int, ...] = ()) -> torch.Tensor:
    """Haar-distributed orthogonal matrices, float64 ``(*batch, d, d)``: QR of a Gaussian with
    the signs of ``diag(R)`` moved into ``Q`` (Mezzadri 2007, §5)."""
    Z = torch.randn(*batch, d, d, generator=gen, dtype=torch.float64)
    Q, R = torch.linalg.qr(Z)
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def draw(spec: str, d_in: int, d_out: int, gen: torch.Generator, *, n: int | None = None, layer: int = 0,
         role: str = "W_V", **params: float) -> torch.Tensor:
    """One ``(d_in, d_out)`` float64 matrix of family ``spec``, or with ``n`` the stack ``(n,
    d_in, d_out)`` of layers ``layer .. layer + n - 1``. ``params`` override the spec's;
    ``layer`` and ``role`` matter only to ``pretrained``. Raises ``ConfigError``: bad spec or
    parameter, or a square-only family with ``d_in != d_out``."""
    name, p = parse_family(spec)
    p = {**p, **parse_family(str(Spec(name, params)))[1]}  # the keyword parameters, read as the spec's
    if name in _SQUARE and d_in != d_out:
        raise ConfigError(f"weight family {name!r} needs a square matrix, got ({d_in}, {d_out})")
    batch = () if n is None else (int(n),)
    return FAMILIES[name](d_in, d_out, gen, p, batch, int(layer), role)


def _gaussian(d_in, d_out, gen, p, batch=(), layer=0, role="W_V"):
    return torch.randn(*batch, d_in, d_out, generator=gen, dtype=torch.float64).mul_(p.get("std", 1 / math.sqrt(d_in)))


def _xavier(d_in, d_out, gen, p, batch=(), layer=0, role="W_V"):
    a = p.get("gain", 1.0) * math.sqrt(6.0 / (d_in + d_out))
    return (torch.rand(*batch, d_in, d_out, generator=gen, dtype=torch.float64) * 2 - 1) * a


def _spd(d, _, gen, p, batch=(), layer=0, role="W_V"):
    lo, hi = p.get("lo", 0.5), p.get("hi", 1.5)
    if not 0 < lo <= hi:
        raise ConfigError(f"spd needs 0 < lo <= hi, got lo={lo}, hi={hi}")
    if batch:  # the same stream as per-layer draws from one generator
        return torch.stack([_spd(d, d, gen, p) for _ in range(batch[0])])
    Q = haar_orthogonal(d, gen)
    lam = lo + (hi - lo) * torch.rand(d, generator=gen, dtype=torch.float64)
    return (Q * lam) @ Q.T


def _eye(d: int, batch: tuple) -> torch.Tensor:
    I = torch.eye(d, dtype=torch.float64)
    return I.expand(*batch, d, d).clone() if batch else I


def _near_identity(d, _, gen, p, batch=(), layer=0, role="W_V"):
    noise = torch.randn(*batch, d, d, generator=gen, dtype=torch.float64) * (p.get("noise", 0.1) / math.sqrt(d))
    return p.get("scale", 1.0) * torch.eye(d, dtype=torch.float64) + noise


RHO = 4.0  # eigenvalue ratio of the equilibria construction: any ρ with σ(ρ) < 1 and τ(ρ)/(1-σ(ρ))² < 1


def construction_eigenvalues(d_model: int, rank: int, rho: float = RHO) -> np.ndarray:
    """``λ_t = ρ^(t - (rank-1)/2)`` for ``t < rank``, ``λ_0 / 2`` for the ``d_model - rank`` others,
    float64 ``(d_model,)``: the diagonal ``W_V`` of the construction of docs/theory.md §3b
    (centred exponents keep ``λ²`` in float64's range up to ``rank = 500``)."""
    lam = rho ** (np.arange(rank, dtype=np.float64) - (rank - 1) / 2)
    return np.concatenate([lam, np.full(d_model - rank, lam[0] / 2)])


def _constructed(d, _, gen, p, batch=(), layer=0, role="W_V"):
    rank = p.get("rank", float(d))
    if rank != int(rank) or not 1 <= rank <= d:
        raise ConfigError(f"constructed needs an integer rank in [1, d={d}], got {rank}")
    lam = construction_eigenvalues(d, int(rank))
    M = p.get("scale", 1.0) * torch.diag(torch.as_tensor(lam, dtype=torch.float64))
    return M.expand(*batch, d, d) if batch else M  # the same matrix for every layer (a view)


@lru_cache(maxsize=1)
def _minilm_layers() -> tuple:
    """all-MiniLM-L6-v2's attention weights per layer (loaded once)."""
    from ..models._quiet import quiet_loading
    from ..models.loading import load_model
    from .pretrained import extract_attention_weights

    with quiet_loading():
        loaded = load_model("minilm")
    return tuple(extract_attention_weights(loaded.model))


def _pretrained(d_in, d_out, gen, p, batch=(), layer=0, role="W_V"):
    layers = _minilm_layers()
    mats = [getattr(lw, role, None) for lw in layers]
    if any(M is None for M in mats):
        raise ConfigError(f"weight family 'pretrained' has no {role}: all-MiniLM-L6-v2 carries W_Q, W_K, W_V, W_O")
    mats = [M.detach().to(torch.float64).cpu() for M in mats]
    rows, cols = mats[0].shape
    if d_in > rows or d_out > cols:
        raise ConfigError(f"weight family 'pretrained' has {role} of shape ({rows}, {cols}); "
                          f"({d_in}, {d_out}) is larger")
    a = p.get("scale", 1.0)
    if not batch:
        return a * mats[layer % len(mats)][:d_in, :d_out]
    return a * torch.stack([mats[(layer + t) % len(mats)][:d_in, :d_out] for t in range(batch[0])])


FAMILIES: dict[str, Callable] = {
    "gaussian": _gaussian,
    "bert": lambda i, o, g, p, b=(), t=0, r="W_V": torch.randn(*b, i, o, generator=g, dtype=torch.float64) * 0.02,
    "xavier": _xavier,
    "orthogonal": lambda d, _, g, p, b=(), t=0, r="W_V": haar_orthogonal(d, g, batch=b) * p.get("scale", 1.0),
    "identity": lambda d, _, g, p, b=(), t=0, r="W_V": _eye(d, b),
    "scaled_identity": lambda d, _, g, p, b=(), t=0, r="W_V": _eye(d, b) * p.get("scale", 1.0),
    "spd": _spd,
    "nonnegative": lambda i, o, g, p, b=(), t=0, r="W_V": _gaussian(i, o, g, p, b).abs(),
    "zero": lambda i, o, g, p, b=(), t=0, r="W_V": torch.zeros(*b, i, o, dtype=torch.float64),
    "near_identity": _near_identity,
    "constructed": _constructed,
    "pretrained": _pretrained,
}
FAMILY_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("std",), "bert": (), "xavier": ("gain",), "orthogonal": ("scale",), "identity": (),
    "scaled_identity": ("scale",), "spd": ("lo", "hi"), "nonnegative": ("std",), "zero": (),
    "near_identity": ("scale", "noise"), "constructed": ("scale", "rank"), "pretrained": ("scale",),
}

MatrixSource = str | torch.Tensor | np.ndarray | Sequence[torch.Tensor | np.ndarray]


def layer_matrix(source: MatrixSource, role: str, layer: int, depth: int, shape: tuple[int, int],
                 seed: int) -> torch.Tensor:
    """The float64 ``shape`` matrix ``role`` of ``layer`` from a family spec, one matrix (all
    layers) or a list of ``depth`` matrices or specs. Raises ``ConfigError``: wrong shape or list
    length, NaN/Inf, a non-numeric entry."""
    if isinstance(source, (list, tuple)):  # a per-layer list may mix family specs and matrices
        if len(source) != depth:
            raise ConfigError(f"{role}: got a list of {len(source)} matrices for depth {depth}")
        source = source[layer]
    if isinstance(source, str):
        return draw(source, shape[0], shape[1], generator(seed, layer, role), layer=layer, role=role)
    check_tensor_storage(source, f"{role} of layer {layer}")
    try:
        M = torch.as_tensor(np.asarray(source) if not isinstance(source, torch.Tensor) else source)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{role} of layer {layer} is not a numeric matrix ({exc})") from None
    if not (M.is_floating_point() or M.dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)):
        raise ConfigError(f"{role} of layer {layer} must be a real numeric matrix, got dtype {M.dtype}")
    M = M.detach().to(device="cpu", dtype=torch.float64)
    if tuple(M.shape) != tuple(shape):
        raise ConfigError(f"{role} of layer {layer} has shape {tuple(M.shape)}, expected {tuple(shape)}")
    if not bool(torch.isfinite(M).all()):
        raise ConfigError(f"{role} of layer {layer} contains NaN or Inf")
    return M


def random_layers(d_model: int, depth: int, *, value: MatrixSource = "gaussian", query_key: MatrixSource = "gaussian",
                  n_heads: int = 1, out_proj: bool = False, mlp_ratio: int | None = None,
                  shared: bool = False, seed: int = 0) -> list[LayerWeights]:
    """Per-layer weights ``W_Q, W_K`` from ``query_key``, ``W_V`` (and with ``out_proj``, ``W_O (d, d)``)
    from ``value``, each a family spec, one ``(d, d)`` matrix or a list of ``depth`` matrices; width
    ``d_model`` divisible by ``n_heads`` (heads side by side in ``(d, d)`` matrices); with ``mlp_ratio``,
    MLP weights ``W_1 (d, m d)``, ``W_2 (m d, d)`` from ``gaussian``; ``shared``: one set of weights
    reused by every layer (ALBERT-style).

    Returns ``depth`` float64 CPU :class:`LayerWeights`; raises ``ConfigError``: ``n_heads``
    not dividing ``d_model``, a bad family or matrix.
    """
    d = d_model
    if d % n_heads:
        raise ConfigError(f"n_heads={n_heads} does not divide d_model={d}")
    n_draw = 1 if shared else depth

    def one(t: int) -> LayerWeights:
        lw = LayerWeights(W_Q=layer_matrix(query_key, "W_Q", t, depth, (d, d), seed),
                          W_K=layer_matrix(query_key, "W_K", t, depth, (d, d), seed),
                          W_V=layer_matrix(value, "W_V", t, depth, (d, d), seed),
                          W_O=layer_matrix(value, "W_O", t, depth, (d, d), seed) if out_proj else None, n_heads=n_heads)
        if mlp_ratio:
            lw.W_1 = layer_matrix("gaussian", "W_1", t, depth, (d, mlp_ratio * d), seed)
            lw.W_2 = layer_matrix("gaussian", "W_2", t, depth, (mlp_ratio * d, d), seed)
        return lw

    threads = min(torch.get_num_threads(), n_draw)  # layers on threads: each matrix has its own generator
    if threads < 2:
        layers = [one(t) for t in range(n_draw)]
    else:
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="rankcollapse-draw") as pool:
            layers = list(pool.map(one, range(n_draw)))
    return layers * depth if shared else layers
