"""Theory checks as table rows (the ``theory`` unit kind), via ``rankcollapse.theory``:
``model = "theory"``, ``variant = <check>``; scalars at ``layer 0`` (or ``layer = k`` per
rank k), trajectories one row per layer.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import binomtest

from .._validate import Spec
from ..dynamics.inputs import sphere_tokens
from ..errors import ConvergenceError
from ..masks import parse_mask
from ..metrics import mu, mu_relative
from ..summary import exact_stats
from ..theory import (basin_estimate, causal_uniform_system, check_sphere_collapse, equilibria, find_equilibria,
                      radius_sweep)
from ..theory.basin import classify, run_sa_ln
from ..theory.equilibria import causal_example_2x2, construct_equilibrium, construction_eigenvalues
from ..theory.system import AttentionSystem
from .energy_controls import (  # noqa: F401  (the energy claims' constructed controls: one home)
    rows_energy_aligned, rows_energy_rising, rows_energy_spread, rows_energy_turning,
)
from .geometry_controls import (  # noqa: F401  (synthetic massive-row matrices, the geometry claims' controls)
    rows_massive_aligned, rows_massive_clipped, rows_massive_null, rows_massive_spike,
)
from .table import rows_from_metrics


def _scalar_rows(values: dict[str, float], mask: str = "", layer: int = 0, n: int = 1, **stats: Any) -> list[dict]:
    return [{"layer": layer, "metric": k, **exact_stats(v, n), "mask": Spec.name_of(mask), "mask_spec": mask, **stats}
            for k, v in values.items()]


def rows_collapse_bound(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """Theorem 1 envelope on pure SA with orthogonal W_V, across causal-sliding widths
    (``theory.radius_sweep``): fitted per-layer rate, envelope rate, violations."""
    b = p.get("budget", {})
    df = radius_sweep(n_tokens=int(p.get("n_tokens", 32)), widths=tuple(p.get("widths", (32, 9, 3))),
                      depth=int(b.get("bound_depth", 60)), n_samples=int(b.get("bound_samples", 8)), seed=int(p.get("seed_theory", 0)))
    rows = []
    for _, r in df.iterrows():
        rows += _scalar_rows({"measured_rate": r["measured_rate"], "envelope_rate": r["envelope_rate"],
                              "n_violations": r["n_violations"], "radius": r["radius"]}, str(r["mask"]), layer=int(r["radius"]))
    return pd.DataFrame(rows)


def rows_sphere_collapse(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """Theorem 2 setting: SA-LN with Haar-orthogonal W_V on inputs with non-negative
    cosines (``theory.check_sphere_collapse``); μ per layer and the fitted rate."""
    b = p.get("budget", {})
    frames = []
    for mask in p.get("masks", ("complete", "causal", "sliding_window:w=3")):
        res = check_sphere_collapse(mask, n_tokens=int(p.get("n_tokens", 16)), d_model=int(p.get("d_model", 8)),
                                    depth=int(b.get("sphere_depth", 80)), n_samples=int(b.get("sphere_samples", 8)),
                                    inputs=p.get("inputs", "nonnegative"))
        traj = rows_from_metrics({"mu": res.mu}, {"mask": Spec.name_of(mask), "mask_spec": mask})
        frames += [traj, pd.DataFrame(_scalar_rows({"measured_rate": res.measured_rate, "min_cos0": res.min_cos0}, mask))]
    return pd.concat(frames, ignore_index=True)


def rows_equilibria(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """The SA-LN construction with >= 2^k equilibria of rank k (``theory.equilibria``):
    per rank k, the number of verified equilibria and how many are stable."""
    n, d = int(p.get("eq_n_tokens", 4)), int(p.get("eq_d_model", 4))
    rows = []
    for k in range(1, min(n, d) + 1):
        es = equilibria(n, d, k)
        stable = sum(bool(e.stable) for e in es.equilibria)
        rows += _scalar_rows({"n_equilibria": len(es.equilibria), "n_stable": stable, "expected_min": 2**k},
                             "causal", layer=k)
    return pd.DataFrame(rows)


def rows_basin(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """Fraction of uniform random starts of the N = d = 2 causal example that converge
    to a rank-2 equilibrium (``theory.basin_estimate``), with its confidence interval."""
    b = p.get("budget", {})
    est = basin_estimate(n_samples=int(b.get("basin_samples", 2000)), depth=int(b.get("basin_depth", 400)))
    rows = _scalar_rows({"basin_fraction": est.fraction}, "causal", n=est.n_samples)
    rows[0].update(q05=est.ci_low, q95=est.ci_high)
    rows += _scalar_rows({"basin_ci_low": est.ci_low, "basin_ci_high": est.ci_high}, "causal", n=est.n_samples)
    return pd.DataFrame(rows)


def rows_equilibria_search(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """Equilibria of one system found by ``theory.find_equilibria`` per rank k (``layer =
    k``; docs/theory.md): causal mask, ``W_Q = W_K = 0``, ``W_V = diag(construction_eigenvalues(d,
    min(N, d)))``, which carries the rank-k construction (≥ 2^k equilibria) for every k.
    ``n_found`` / ``n_constructed_found``: distinct equilibria and constructed ones found from
    the constructed states plus random starts; ``*_perturbed``: from the constructed states
    moved by noise of std ``search_perturbation`` only; ``*_random``: from ``search_starts``
    random starts only; ``n_stable``; ``expected_min = 2^k``.
    """
    n, d = int(p.get("eq_n_tokens", 4)), int(p.get("eq_d_model", 4))
    top = min(n, d)
    lam = construction_eigenvalues(d, top)
    system = causal_uniform_system(torch.diag(torch.tensor(lam)), n)
    built = {k: torch.from_numpy(np.stack([construct_equilibrium(n, lam, signs)
                                           for signs in itertools.product((1, -1), repeat=k)])) for k in range(1, top + 1)}
    starts = torch.cat(list(built.values()))
    seed = int(p.get("seed_theory", 0))
    settings = {"n_starts": int(p.get("search_starts", 256)), "seed": seed, "tol": 1e-12}
    found = find_equilibria(system, starts=starts, **settings)
    alone = find_equilibria(system, **settings)  # random starts only: what the search finds by itself
    gen = torch.Generator().manual_seed(seed)
    noisy = starts + float(p.get("search_perturbation", 0.01)) * torch.randn(starts.shape, generator=gen, dtype=torch.float64)
    near = find_equilibria(system, starts=noisy, **{**settings, "n_starts": 0})

    def constructed(res: Any, k: int) -> int:
        return sum(any(float((c - e.X).abs().max()) <= 1e-4 for e in res.equilibria) for c in built[k])

    union = list(found.equilibria)
    union += [e for e in alone.equilibria if not any(float((e.X - u.X).abs().max()) <= 1e-4 for u in found.equilibria)]
    rows = []
    for k in range(1, top + 1):
        rank_k = lambda res: [e for e in res.equilibria if e.rank == k]  # noqa: E731
        rows += _scalar_rows({"n_found": len(rank_k(found)), "n_constructed_found": constructed(found, k),
                              "n_found_perturbed": len(rank_k(near)), "n_constructed_perturbed": constructed(near, k),
                              "n_found_random": len(rank_k(alone)), "n_constructed_random": constructed(alone, k),
                              "n_stable": sum(bool(e.stable) for e in union if e.rank == k),
                              "expected_min": 2**k}, "causal", layer=k)
    return pd.DataFrame(rows)


def rows_averaging_rate(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """``averaging_rate`` of each mask at N = ``rate_n_tokens``: the second-largest
    eigenvalue modulus of ``P = D^-1 M``, the rate at which ``X <- P X`` removes the
    non-uniform part."""
    n = int(p.get("rate_n_tokens", 128))
    rows = []
    for spec in p.get("rate_masks", ("complete", "causal", "sliding_window:w=9")):
        M = parse_mask(str(spec), n).to_dense().double().numpy()
        P = M / M.sum(axis=1, keepdims=True)
        ev = np.sort(np.abs(np.linalg.eigvals(P)))[::-1]
        rows += _scalar_rows({"averaging_rate": float(ev[1]) if n > 1 else 0.0}, str(spec))
    return pd.DataFrame(rows)


def _example_trajectories(p: dict[str, Any], in_basin: bool) -> pd.DataFrame:
    """μ/‖X‖_F and μ per layer of the N = d = 2 causal SA-LN example (docs/theory.md §3a), from inside or outside
    the basin of its stable rank-2 point B (token 1 within ±0.05 rad of B, or at an angle in (60°, 250°))."""
    ex = causal_example_2x2()
    system = ex.system.to(torch.float64)
    n, depth = int(p.get("example_samples", 16)), int(p.get("example_depth", 64))
    g = torch.Generator().manual_seed(int(p.get("seed_theory", 0)))
    u = lambda: 2 * torch.rand(n, generator=g, dtype=torch.float64) - 1  # noqa: E731  uniform in (-1, 1)
    a0 = math.pi / 2 + 0.05 * u()
    b = math.atan2(ex.info["B"][1], ex.info["B"][0])
    a1 = b + 0.05 * u() if in_basin else math.radians(155) + math.radians(95) * u()
    X = torch.stack([torch.stack([a0.cos(), a0.sin()], -1), torch.stack([a1.cos(), a1.sin()], -1)], 1)
    states = [X]
    for _ in range(depth):
        states.append(system.step(states[-1], check=False))
    return rows_from_metrics({"mu_relative": torch.stack([mu_relative(X) for X in states]),
                              "mu": torch.stack([mu(X) for X in states])}, {"mask": "causal", "mask_spec": "causal"})


def rows_ln_example_basin(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """The N = d = 2 causal SA-LN example started in its rank-2 basin: no collapse."""
    return _example_trajectories(p, True)


def rows_ln_example_outside(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """The same example started outside that basin: collapse to rank 1."""
    return _example_trajectories(p, False)


def rows_equilibria_control(p: dict[str, Any], ctx: Any) -> pd.DataFrame:
    """A system with no equilibrium (complete mask, ``W_Q = W_K = 0``, ``W_V = -I``: every
    step flips the sign of ``normalise(mean)``), read like ``equilibria_search`` and
    ``basin``: per rank k ``n_found``, ``n_constructed_perturbed`` (both what the search
    finds) and ``expected_min``; at layer 0 the basin fraction with its Wilson interval."""
    def system(n: int, d: int) -> AttentionSystem:
        zeros = torch.zeros(d, 1, dtype=torch.float64)
        return AttentionSystem(torch.ones(n, n, dtype=torch.bool), zeros, zeros.clone(),
                               -torch.eye(d, dtype=torch.float64), 1.0)

    n, d = int(p.get("eq_n_tokens", 4)), int(p.get("eq_d_model", 4))
    try:
        found = find_equilibria(system(n, d), n_starts=int(p.get("control_starts", 16)),
                                seed=int(p.get("seed_theory", 0)), tol=1e-12).equilibria
    except ConvergenceError:
        found = []
    rows = []
    for k in range(1, min(n, d) + 1):
        hits = sum(e.rank == k for e in found)
        rows += _scalar_rows({"n_found": hits, "n_constructed_perturbed": hits, "expected_min": 2**k}, "complete",
                             layer=k)
    b = p.get("budget", {})
    n_samples = int(b.get("basin_samples", 2000))
    small = system(2, 2)
    X = run_sa_ln(small, sphere_tokens(n_samples, 2, 2, generator=torch.Generator().manual_seed(0)),
                  int(b.get("basin_depth", 400)))
    rank, conv = classify(small, X)
    hits = int(((rank == 2) & conv).sum())
    ci = binomtest(hits, n_samples).proportion_ci(0.95, method="wilson")
    rows += _scalar_rows({"basin_fraction": hits / n_samples, "basin_ci_low": ci.low, "basin_ci_high": ci.high},
                         "complete", n=n_samples)
    return pd.DataFrame(rows)

