"""Initial token matrices ``X(0)``, the one registry of input distributions (docs/dynamics.md,
"Initial tokens"): ``draw(n_samples, n_tokens, d_model, *, seed=0, generator=None, ...)`` returns
float64 CPU ``(B, N, d)``, a ``generator`` replacing the one seeded by ``seed``.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable

import torch

from .._memory import check_memory
from .._validate import Key, Spec, check_float, check_int
from ..errors import ConfigError
from .layers import sphere


def _check(n_samples: int, n_tokens: int, d_model: int) -> None:
    for name, value in (("n_samples", n_samples), ("n_tokens", n_tokens), ("d_model", d_model)):
        check_int(value, name, low=1)
    check_memory(16 * n_samples * n_tokens * d_model, f"drawing {n_samples} x {n_tokens} x {d_model} input tokens "
                 "(B x N x d, float64)", adjustable=False)


def seeded_generator(seed: int, generator: torch.Generator | None = None) -> torch.Generator:
    """``generator`` when given, else a CPU generator seeded with ``seed`` (``ConfigError``: not an int >= 0)."""
    return torch.Generator().manual_seed(check_int(seed, "seed", low=0)) if generator is None else generator


def gaussian_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0, std: float = 1.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """i.i.d. ``N(0, std^2)`` entries, float64 ``(n_samples, n_tokens, d_model)``. Raises
    ``ConfigError``: a size < 1, ``seed`` < 0, ``std`` not > 0."""
    _check(n_samples, n_tokens, d_model)
    std = check_float(std, "gaussian input std", low=0, strict_low=True)
    gen = seeded_generator(seed, generator)
    return torch.randn(n_samples, n_tokens, d_model, generator=gen, dtype=torch.float64) * std


def sphere_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens uniform on the unit sphere ``S^{d-1}`` (normalised Gaussians; Muller 1959)."""
    return sphere(gaussian_tokens(n_samples, n_tokens, d_model, seed=seed, generator=generator))[0]


def hemisphere_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                      pole: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens uniform on the open hemisphere ``<x, pole> > 0`` (default pole ``e_1``): sphere
    samples reflected across the pole's hyperplane (spec.md §5.2's start). Raises ``ConfigError``:
    ``pole`` of the wrong shape or zero."""
    X = sphere_tokens(n_samples, n_tokens, d_model, seed=seed, generator=generator)
    p = torch.zeros(d_model, dtype=torch.float64) if pole is None else torch.as_tensor(pole, dtype=torch.float64)
    if pole is None:
        p[0] = 1.0
    if p.shape != (d_model,) or not bool(p.norm() > 0):
        raise ConfigError(f"pole must be a nonzero vector of length {d_model}")
    p = p / p.norm()
    return X - 2 * torch.clamp(X @ p, max=0.0).unsqueeze(-1) * p


def nonnegative_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Unit tokens ``|g| / ||g||``, ``g ~ N(0, I_d)``: every pairwise cosine ``>= 0`` (spec.md §5.2)."""
    return sphere(gaussian_tokens(n_samples, n_tokens, d_model, seed=seed, generator=generator).abs())[0]


def antipodal_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Unit tokens ``normalise((-1)^i v + 1e-3 g_i)``, ``v`` uniform on the sphere per sample
    (drawn after ``g``): two antipodal clusters, violating Theorem 2's condition."""
    _check(n_samples, n_tokens, d_model)
    gen = seeded_generator(seed, generator)
    G = torch.randn(n_samples, n_tokens, d_model, generator=gen, dtype=torch.float64)
    v = sphere(torch.randn(n_samples, 1, d_model, generator=gen, dtype=torch.float64))[0]
    signs = (1 - 2 * (torch.arange(n_tokens) % 2)).to(torch.float64).view(1, n_tokens, 1)
    return sphere(signs * v + 1e-3 * G)[0]


def simplex_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0, rho: float = 0.5,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Unit tokens ``x_i = sqrt(rho) e_1 + sqrt(1 - rho) u_i``, ``u_i`` uniform on the unit sphere
    of ``x_1 = 0``: pairwise cosines ``rho + O((1 - rho) / sqrt(d - 1))``, the almost-simplex
    start of Chen, Lin, Polyanskiy & Rigollet (ICLR 2026). Raises ``ConfigError``: ``d_model < 2``,
    ``rho`` outside ``[0, 1)``."""
    _check(n_samples, n_tokens, d_model)
    if d_model < 2 or not 0 <= rho < 1:
        raise ConfigError(f"simplex tokens need d_model >= 2 and 0 <= rho < 1, got d_model = {d_model}, rho = {rho}")
    G = torch.randn(n_samples, n_tokens, d_model, generator=seeded_generator(seed, generator), dtype=torch.float64)
    G[..., 0] = 0.0
    X = sphere(G)[0] * (1.0 - rho) ** 0.5
    X[..., 0] = rho ** 0.5
    return X


def wikipedia_tokens(n_samples: int, n_tokens: int, d_model: int | None = None, *, seed: int = 0,
                     generator: torch.Generator | None = None, model: Any = "minilm", block: int = 0) -> torch.Tensor:
    """The embedding-layer output of ``model`` on windows of ``n_tokens`` tokens of the shipped
    Wikipedia extracts: windows ``block * n_samples .. (block + 1) * n_samples - 1`` of those
    :func:`rankcollapse.data.make_windows` cuts with ``seed`` (blocks are disjoint). ``d_model``: None,
    the model's width; an int ``d <= width``, the coordinates in the top-``d`` right singular vectors of
    the batch's ``(n_samples * n_tokens, width)`` token matrix. ``model``: ``"minilm"`` (default),
    ``"smollm2"``, a folder or hub name (loaded once per process), or a loaded model. ``generator``: not
    accepted (the windows are drawn by ``seed``).

    Raises ``ConfigError``: a ``generator``, ``d_model`` larger than the model's width, bad
    sizes; ``DataError``, ``ModelError``, ``TokenizerError`` when the corpus or model is not
    installed or the windows cannot be cut.
    """
    if generator is not None:
        raise ConfigError("input 'wikipedia' is drawn by seed (its windows), not from a generator")
    check_int(n_samples, "n_samples", low=1)
    check_int(n_tokens, "n_tokens", low=1)
    block = check_int(block, "block", low=0)
    seed = check_int(seed, "seed", low=0)
    embeddings = _cached_embeddings if isinstance(model, str) else _embeddings
    E = embeddings(model, n_tokens, n_samples * (block + 1), seed)
    E = E[block * n_samples:(block + 1) * n_samples]
    if d_model is None:
        return E
    d = check_int(d_model, "d_model", low=1)
    if d > E.shape[-1]:
        raise ConfigError(f"input 'wikipedia' has width {E.shape[-1]}, d_model={d} is larger")
    _, _, Vh = torch.linalg.svd(E.reshape(-1, E.shape[-1]), full_matrices=False)
    return E @ Vh[:d].T


def _embeddings(loaded: Any, n_tokens: int, n_samples: int, seed: int) -> torch.Tensor:
    """float64 ``(n_samples, n_tokens, width)`` embeddings of a loaded model."""
    from .. import data
    from ..models.probe import embed

    windows = data.make_windows(data.wikipedia_texts(), loaded.require_tokenizer(), n_tokens=n_tokens,
                                n_samples=n_samples, seed=seed)
    with torch.no_grad():
        return embed(loaded, windows).detach().to(torch.float64)


@lru_cache(maxsize=4)
def _cached_embeddings(model: str, n_tokens: int, n_samples: int, seed: int) -> torch.Tensor:
    """:func:`_embeddings` of the model named ``model``, loaded once (read-only)."""
    from ..models._quiet import quiet_loading
    from ..models.loading import load_model

    with quiet_loading():
        loaded = load_model(model)
    return _embeddings(loaded, n_tokens, n_samples, seed)


INPUTS: dict[str, Callable[..., torch.Tensor]] = {
    "gaussian": gaussian_tokens, "sphere": sphere_tokens, "hemisphere": hemisphere_tokens,
    "nonnegative": nonnegative_tokens, "antipodal": antipodal_tokens, "simplex": simplex_tokens,
    "wikipedia": wikipedia_tokens}
#: inputs whose rows lie on the unit sphere
ON_SPHERE = ("sphere", "hemisphere", "nonnegative", "antipodal", "simplex")


#: name -> the keys of its spec ``NAME[:key=value,...]`` (a hemisphere's pole: an option of make_tokens)
KEYS: dict[str, tuple[Key, ...]] = {name: () for name in INPUTS} | {
    "gaussian": (Key("std", default=None),), "simplex": (Key("rho", default=None),),
    "wikipedia": (Key("model", "str", None), Key("block", "int", None))}


def canonical_input(spec: str) -> str:
    """``spec`` checked against :data:`INPUTS` and :data:`KEYS`, written canonically
    (``ConfigError`` otherwise, listing the inputs)."""
    return str(Spec.parse(spec, "input", names=KEYS))


def make_tokens(spec: str, n_samples: int, n_tokens: int, d_model: int | None, *, seed: int = 0,
                generator: torch.Generator | None = None, **options: Any) -> torch.Tensor:
    """``X(0)`` float64 ``(n_samples, n_tokens, d_model)`` of the input ``spec``:
    ``INPUTS[NAME](n_samples, n_tokens, d_model, seed=seed, generator=generator, **keys, **options)``.

    Raises ``ConfigError``: an unknown name, an option the input does not take or given
    twice (in ``spec`` and ``options``), bad sizes, ``d_model=None`` other than for ``wikipedia``.
    """
    parsed = Spec.parse(spec, "input", names=KEYS)
    draw = INPUTS[parsed.name]
    if d_model is None and draw is not wikipedia_tokens:
        raise ConfigError(f"input {spec!r} needs the width d_model")
    allowed = set(inspect.signature(draw).parameters) - {"n_samples", "n_tokens", "d_model", "seed", "generator"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"input {parsed.name!r} takes the options {sorted(allowed) or 'none'}, got {unknown}")
    twice = sorted(set(options) & set(parsed.params))
    if twice:
        raise ConfigError(f"input {spec!r}: key {twice[0]!r} given twice (in the spec and as an option)")
    return draw(n_samples, n_tokens, d_model, seed=seed, generator=generator, **parsed.params, **options)
