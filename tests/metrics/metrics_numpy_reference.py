"""Independent float64 numpy implementations, written from the formulas with explicit
loops over tokens and pairs (no shared code with rankcollapse.metrics)."""

from __future__ import annotations

import math

import numpy as np


def mu(X):
    return float(np.linalg.norm(X - X.mean(axis=0), "fro"))


def mu_relative(X):
    return mu(X) / float(np.linalg.norm(X, "fro"))


def max_token_share(X):
    return float(np.max(np.sum(X * X, axis=1)) / np.sum(X * X))


def norm_spread(X):
    n = np.sqrt(np.sum(X * X, axis=1))
    return float(n.max() / n.min())


def n_clusters(X, angle=0.1):
    """Union-find over pairs at angle < 0.1 rad among the non-zero tokens."""
    n = np.sqrt(np.sum(X * X, axis=1))
    U = X[n > 0] / n[n > 0, None]
    parent = list(range(len(U)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(U)):
        for j in range(i + 1, len(U)):
            if U[i] @ U[j] >= np.cos(angle):
                parent[root(i)] = root(j)
    return float(len({root(i) for i in range(len(U))}))


def svals(X):
    return np.linalg.svd(X, compute_uv=False)


def numerical_rank(X):
    return float(np.linalg.matrix_rank(X))


def rank_fraction(X):
    return numerical_rank(X) / min(X.shape)


def sigma_min(X):
    return float(svals(X)[-1])


def sigma_ratio(X):
    s = svals(X)
    return float(s[1] / s[0]) if len(s) > 1 else 0.0


def rank_one_distance(X):
    U, s, Vt = np.linalg.svd(X, full_matrices=False)
    best = s[0] * np.outer(U[:, 0], Vt[0])  # Eckart–Young rank-one approximation
    return float(np.linalg.norm(X - best, "fro"))


def stable_rank(X):
    return float(np.linalg.norm(X, "fro") ** 2 / np.linalg.norm(X, 2) ** 2)


def effective_rank(X):
    s = svals(X)
    p = s / s.sum()
    p = p[p > 0]
    return float(math.exp(-np.sum(p * np.log(p))))


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _nonzero_rows(X):
    return [x for x in X if np.linalg.norm(x) > 0]


def avg_abs_cos(X, signed=False):
    rows = _nonzero_rows(X)
    if len(rows) < 2:
        return 1.0
    vals = [_cos(a, b) for i, a in enumerate(rows) for j, b in enumerate(rows) if i != j]
    return float(np.mean(vals if signed else np.abs(vals)))


def avg_cos(X):
    return avg_abs_cos(X, signed=True)


def cos_to_mean(X):
    m = X.mean(axis=0)
    return float(np.mean([_cos(x, m) for x in _nonzero_rows(X)]))


def dong_residual(X):
    R = X - X.mean(axis=0)
    return float(math.sqrt(np.linalg.norm(R, 1) * np.linalg.norm(R, np.inf)))


def dong_residual_relative(X):
    return dong_residual(X) / math.sqrt(np.linalg.norm(X, 1) * np.linalg.norm(X, np.inf))


def dirichlet_energy(X, M=None):
    N = X.shape[0]
    M = np.ones((N, N), bool) if M is None else M
    total = sum(np.sum((X[i] - X[j]) ** 2) for i in range(N) for j in range(N) if M[i, j])
    return float(total / N)


def mean_average_distance(X, M=None):
    N = X.shape[0]
    M = np.ones((N, N), bool) if M is None else M
    nz = [np.linalg.norm(x) > 0 for x in X]
    row_means = []
    for i in range(N):
        d = [1 - _cos(X[i], X[j]) for j in range(N) if M[i, j] and i != j and nz[i] and nz[j]]
        if d:
            row_means.append(np.mean(d))
    return float(np.mean(row_means)) if row_means else 0.0


def isoscore(X):
    """Rudman et al. (2022) Algorithm 1 step by step: PCA via the d x d covariance."""
    N, n = X.shape
    Xc = X - X.mean(axis=0)
    cov = Xc.T @ Xc / max(N - 1, 1)
    _, V = np.linalg.eigh(cov)
    X_pca = Xc @ V  # step 2: reorient
    var = np.array([np.sum(X_pca[:, k] ** 2) / max(N - 1, 1) for k in range(n)])  # step 3
    if np.linalg.norm(var) == 0:
        return 0.0
    if n == 1:
        return 1.0
    var_hat = math.sqrt(n) * var / np.linalg.norm(var)  # step 4
    delta = np.linalg.norm(var_hat - 1) / math.sqrt(2 * (n - math.sqrt(n)))  # step 5
    phi = (n - delta**2 * (n - math.sqrt(n))) ** 2 / n**2  # step 6
    return float((n * phi - 1) / (n - 1))  # step 7


ALL = {
    fn.__name__: fn
    for fn in (
        mu, mu_relative, max_token_share, norm_spread, n_clusters, numerical_rank, rank_fraction, sigma_min, sigma_ratio,
        rank_one_distance, stable_rank, effective_rank, avg_abs_cos, avg_cos,
        cos_to_mean, dong_residual, dong_residual_relative, dirichlet_energy,
        mean_average_distance, isoscore,
    )
}


# ---- geometry (massive tokens, spectrum shape) ----------------------------------
def max_norm_ratio(X):
    norms = np.linalg.norm(X, axis=1)
    return float(norms.max() / np.median(norms))


def max_norm_position(X):
    return float(np.argmax(np.linalg.norm(X, axis=1)))


def top_singular_share(X):
    return float(np.linalg.norm(X, 2) ** 2 / np.linalg.norm(X, "fro") ** 2)


def max_token_sigma_share(X):
    return float(np.max(np.sum(X * X, axis=1)) / np.linalg.norm(X, 2) ** 2)


def matrix_entropy(X):
    s = svals(X)
    p = s**2 / np.sum(s**2)
    p = p[p > 0]
    return float(-np.sum(p * np.log(p)))


def alpha_req(X):
    """OLS of ln sigma_i^2 on ln i over i = 1..matrix_rank (numpy's polyfit)."""
    s = svals(X)[: np.linalg.matrix_rank(X)]
    slope, _ = np.polyfit(np.log(np.arange(1, len(s) + 1)), np.log(s**2), 1)
    return float(-slope)


ALL.update({fn.__name__: fn for fn in (
    max_norm_ratio, max_norm_position, top_singular_share, max_token_sigma_share, matrix_entropy, alpha_req)})


def token_radius(X):
    """(1/N) sum_i ||x_i||."""
    return float(np.linalg.norm(X, axis=1).mean())


ALL["token_radius"] = token_radius


def interaction_energy(X, beta=1.0):
    """(1 / 2 beta) sum_{i,j} exp(beta <u_i, u_j>) over the non-zero rows' directions."""
    U = np.array(_nonzero_rows(X))
    U = U / np.linalg.norm(U, axis=1, keepdims=True)
    return float(np.exp(beta * (U @ U.T)).sum() / (2.0 * beta))


ALL["interaction_energy"] = interaction_energy

#: Registry metrics undefined below rank two (a MetricError there): the rest are
#: computed on every input of the "all" tests.
NEEDS_RANK_TWO = frozenset({"alpha_req"})


def names_at_rank(rank: int, names) -> tuple[str, ...]:
    """``names`` without the metrics undefined at ``rank`` (:data:`NEEDS_RANK_TWO` below 2)."""
    return tuple(n for n in names if rank >= 2 or n not in NEEDS_RANK_TWO)
