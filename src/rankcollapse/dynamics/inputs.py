"""Initial token matrices ``X(0)``: the one registry of input distributions.

Every input is a function ``draw(n_samples, n_tokens, d_model, *, seed=0, generator=None, ...)``
returning a float64 CPU tensor ``(B, N, d) = (n_samples, n_tokens, d_model)``; the same ``seed`` gives
the same numbers on every machine (cast with ``.to(dtype, device)``). ``generator``, when
given, replaces the fresh generator seeded by ``seed`` (the draw continues its stream).
Look one up by its spec (``NAME[:key=value,...]``, keys :data:`KEYS`) with
:func:`make_tokens`; :data:`INPUTS` lists them:

================  ==========================================================  ===============
name              distribution (rows ``x_i`` of ``X(0)``)                     on the sphere
================  ==========================================================  ===============
``gaussian``      i.i.d. ``N(0, std^2)`` entries (default ``std = 1``)         no
``sphere``        uniform on ``S^{d-1}``: ``g / ||g||``, ``g ~ N(0, I)``         yes
                  (Muller 1959)
``hemisphere``    uniform on the open hemisphere ``<x, pole> > 0`` (default     yes
                  pole ``e_1``): sphere samples reflected across the pole's
                  hyperplane (Theorem 2's start, docs/theory.md)
``nonnegative``   ``|g| / ||g||``: every pairwise cosine ``>= 0`` (Theorem 2's   yes
                  condition, spec.md §5.2)
``antipodal``     ``(±1)^i v + 1e-3 g``, normalised: tokens alternate at        yes
                  ``±v`` (cosines near -1, violating Theorem 2's condition)
``simplex``       ``sqrt(rho) e_1 + sqrt(1 - rho) u_i``, ``u_i`` uniform on the   yes
                  unit sphere of ``e_1``'s complement (default ``rho = 1/2``):
                  pairwise cosines ``rho + O((1 - rho)/sqrt(d))``, the
                  almost-simplex start of Chen et al. (ICLR 2026)
``wikipedia``     a model's embedding-layer output on windows of the shipped    no
                  English Wikipedia extracts (default all-MiniLM-L6-v2)
================  ==========================================================  ===============
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
    # the draw and its normalised copy, float64
    check_memory(16 * n_samples * n_tokens * d_model, f"drawing {n_samples} x {n_tokens} x {d_model} input tokens "
                 "(B x N x d, float64)", adjustable=False)


def _generator(seed: int, generator: torch.Generator | None) -> torch.Generator:
    return torch.Generator().manual_seed(check_int(seed, "seed", low=0)) if generator is None else generator


def gaussian_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0, std: float = 1.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """i.i.d. ``N(0, std^2)`` entries, float64 ``(n_samples, n_tokens, d_model)``; drawn
    from ``generator`` instead of a fresh one seeded by ``seed`` when given.

    Raises
    ------
    ConfigError
        ``n_samples``, ``n_tokens`` or ``d_model`` < 1, ``seed`` < 0, ``std`` not > 0.
    """
    _check(n_samples, n_tokens, d_model)
    std = check_float(std, "gaussian input std", low=0, strict_low=True)
    gen = _generator(seed, generator)
    return torch.randn(n_samples, n_tokens, d_model, generator=gen, dtype=torch.float64) * std


def sphere_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens uniform on the unit sphere ``S^{d-1}`` (normalised Gaussians; Muller 1959),
    float64 ``(n_samples, n_tokens, d_model)``, projected by
    :func:`~rankcollapse.dynamics.layers.sphere`."""
    return sphere(gaussian_tokens(n_samples, n_tokens, d_model, seed=seed, generator=generator))[0]


def hemisphere_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                      pole: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Tokens uniform on the open hemisphere ``{x in S^{d-1}: <x, pole> > 0}`` (default
    pole ``e_1``), float64 ``(n_samples, n_tokens, d_model)``: sphere samples reflected across the
    pole's hyperplane when needed, so every pair has ``<x_i, pole> > 0`` (the initial
    condition of spec.md §5.2).

    Raises
    ------
    ConfigError
        ``pole`` of the wrong shape or zero.
    """
    X = sphere_tokens(n_samples, n_tokens, d_model, seed=seed, generator=generator)
    d = d_model  # the formulas' name
    p = torch.zeros(d, dtype=torch.float64) if pole is None else torch.as_tensor(pole, dtype=torch.float64)
    if pole is None:
        p[0] = 1.0
    if p.shape != (d,) or not bool(p.norm() > 0):
        raise ConfigError(f"pole must be a nonzero vector of length {d}")
    p = p / p.norm()
    c = X @ p  # (B, N)
    X = X - 2 * torch.clamp(c, max=0.0).unsqueeze(-1) * p
    return X


def nonnegative_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Unit tokens ``|g| / ||g||`` with ``g ~ N(0, I_d)``, float64
    ``(n_samples, n_tokens, d_model)``: non-negative entries, so every pairwise cosine is
    ``>= 0`` (Theorem 2's condition, spec.md §5.2)."""
    _check(n_samples, n_tokens, d_model)
    G = torch.randn(n_samples, n_tokens, d_model, generator=_generator(seed, generator), dtype=torch.float64)
    return sphere(G.abs())[0]


def antipodal_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """Unit tokens ``normalise((-1)^i v + 1e-3 g_i)`` with ``v`` uniform on the sphere (one
    per sample) and ``g_i ~ N(0, I_d)``, float64 ``(n_samples, n_tokens, d_model)``: two
    antipodal clusters (cosines near -1, violating Theorem 2's condition). ``g`` is drawn
    before ``v``."""
    _check(n_samples, n_tokens, d_model)
    gen = _generator(seed, generator)
    G = torch.randn(n_samples, n_tokens, d_model, generator=gen, dtype=torch.float64)
    v = sphere(torch.randn(n_samples, 1, d_model, generator=gen, dtype=torch.float64))[0]
    signs = (1 - 2 * (torch.arange(n_tokens) % 2)).to(torch.float64).view(1, n_tokens, 1)
    return sphere(signs * v + 1e-3 * G)[0]


def simplex_tokens(n_samples: int, n_tokens: int, d_model: int, *, seed: int = 0, rho: float = 0.5,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Unit tokens ``x_i = sqrt(rho) e_1 + sqrt(1 - rho) u_i`` with ``u_i`` uniform on the unit
    sphere of the hyperplane ``x_1 = 0`` (normalised Gaussians with their first entry set
    to 0), float64 ``(n_samples, n_tokens, d_model)``: ``<x_i, x_j> = rho + (1 - rho) <u_i, u_j>``, so
    every pairwise cosine is ``rho`` up to ``O((1 - rho) / sqrt(d - 1))``: the almost-simplex
    configuration of Chen, Lin, Polyanskiy & Rigollet, "Critical attention scaling in
    long-context transformers" (ICLR 2026), whose critical scale is ``β = log n / (1 - rho)``.

    Raises
    ------
    ConfigError
        ``d_model < 2``, ``rho`` outside ``[0, 1)``.
    """
    _check(n_samples, n_tokens, d_model)
    if d_model < 2 or not 0 <= rho < 1:
        raise ConfigError(f"simplex tokens need d_model >= 2 and 0 <= rho < 1, got d_model = {d_model}, rho = {rho}")
    G = torch.randn(n_samples, n_tokens, d_model, generator=_generator(seed, generator), dtype=torch.float64)
    G[..., 0] = 0.0
    X = sphere(G)[0] * (1.0 - rho) ** 0.5
    X[..., 0] = rho ** 0.5
    return X


def wikipedia_tokens(n_samples: int, n_tokens: int, d_model: int | None = None, *, seed: int = 0,
                     generator: torch.Generator | None = None, model: Any = "minilm", block: int = 0) -> torch.Tensor:
    """The embedding-layer output (``hidden_states[0]``, :func:`rankcollapse.models.embed`)
    of ``model`` on windows of ``n_tokens`` tokens of the shipped English Wikipedia
    extracts (:func:`rankcollapse.data.wikipedia_texts`), float64
    ``(n_samples, n_tokens, d_model)``.

    The windows are numbers ``block * n_samples`` to ``(block + 1) * n_samples - 1`` of the
    ``(block + 1) * n_samples`` windows :func:`rankcollapse.data.make_windows` cuts with
    ``seed``: blocks ``0, 1, ...`` of one seed are disjoint windows.

    Parameters
    ----------
    d_model : None (default): the model's width, embeddings as they are. An int
        ``d <= width``: the tokens' coordinates ``X V_d`` in the top-``d`` right singular
        vectors ``V_d`` of the batch's ``(n_samples * n_tokens, width)`` token matrix (an
        isometry when ``d`` is the width).
    model : ``"minilm"`` (default), ``"smollm2"``, a model folder or hub name
        (:func:`rankcollapse.models.load_model`; loaded once per process), or a loaded model.
    generator : not accepted (the windows are drawn by ``seed``).

    Raises
    ------
    ConfigError
        ``generator`` given, ``d_model`` larger than the model's width, bad sizes.
    DataError, ModelError, TokenizerError
        The corpus or model is not installed, or the windows cannot be cut.
    """
    if generator is not None:
        raise ConfigError("input 'wikipedia' is drawn by seed (its windows), not from a generator")
    check_int(n_samples, "n_samples", low=1)
    check_int(n_tokens, "n_tokens", low=1)
    block = check_int(block, "block", low=0)
    seed = check_int(seed, "seed", low=0)
    if isinstance(model, str):
        E = _cached_embeddings(model, n_tokens, n_samples * (block + 1), seed)
    else:
        E = _embeddings(model, n_tokens, n_samples * (block + 1), seed)
    E = E[block * n_samples:(block + 1) * n_samples]
    if d_model is None:
        return E
    d = check_int(d_model, "d_model", low=1)
    if d > E.shape[-1]:
        raise ConfigError(f"input 'wikipedia' has width {E.shape[-1]}, d_model={d} is larger")
    _, _, Vh = torch.linalg.svd(E.reshape(-1, E.shape[-1]), full_matrices=False)
    return E @ Vh[:d].T


def _embeddings(loaded: Any, n_tokens: int, n_samples: int, seed: int) -> torch.Tensor:
    """float64 ``(n_samples, n_tokens, width)`` embeddings of ``loaded`` (a loaded model)."""
    from .. import data
    from ..models.probe import embed

    windows = data.make_windows(data.wikipedia_texts(), loaded.require_tokenizer(), n_tokens=n_tokens,
                                n_samples=n_samples, seed=seed)
    with torch.no_grad():
        return embed(loaded, windows).detach().to(torch.float64)


@lru_cache(maxsize=4)
def _cached_embeddings(model: str, n_tokens: int, n_samples: int, seed: int) -> torch.Tensor:
    """:func:`_embeddings` of the model named ``model``, loaded quietly once (read-only)."""
    from ..models._quiet import quiet_loading
    from ..models.loading import load_model

    with quiet_loading():
        loaded = load_model(model)
    return _embeddings(loaded, n_tokens, n_samples, seed)


#: name -> draw function (module table); the one place an input is looked up by name.
INPUTS: dict[str, Callable[..., torch.Tensor]] = {
    "gaussian": gaussian_tokens,
    "sphere": sphere_tokens,
    "hemisphere": hemisphere_tokens,
    "nonnegative": nonnegative_tokens,
    "antipodal": antipodal_tokens,
    "simplex": simplex_tokens,
    "wikipedia": wikipedia_tokens,
}
#: inputs whose rows lie on the unit sphere
ON_SPHERE = ("sphere", "hemisphere", "nonnegative", "antipodal", "simplex")


#: name -> the keys its spec ``NAME[:key=value,...]`` takes (``simplex:rho=0.9``); a
#: hemisphere's pole (a vector) is an option of :func:`make_tokens` only
KEYS: dict[str, tuple[Key, ...]] = {name: () for name in INPUTS} | {
    "gaussian": (Key("std", default=None),), "simplex": (Key("rho", default=None),),
    "wikipedia": (Key("model", "str", None), Key("block", "int", None))}


def canonical_input(spec: str) -> str:
    """``spec`` (``NAME[:key=value,...]``), checked to be an input of :data:`INPUTS` with
    its keys, written canonically (``simplex:rho=0.9``).

    Raises
    ------
    ConfigError
        ``spec`` is not an input (the message lists them), an unknown key or bad value.
    """
    return str(Spec.parse(spec, "input", names=KEYS))


def make_tokens(spec: str, n_samples: int, n_tokens: int, d_model: int | None, *, seed: int = 0,
                generator: torch.Generator | None = None, **options: Any) -> torch.Tensor:
    """``X(0)`` float64 ``(n_samples, n_tokens, d_model)`` of the input ``spec``
    (``NAME[:key=value,...]``, :data:`INPUTS` and :data:`KEYS`), ``INPUTS[NAME](n_samples,
    n_tokens, d_model, seed=seed, generator=generator, **keys, **options)``.

    Raises
    ------
    ConfigError
        Unknown name, an option the input does not take or given twice (in ``spec`` and
        ``options``), bad sizes; ``d_model=None`` for an input other than ``wikipedia``.
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
