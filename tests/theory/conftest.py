"""Shared test helpers of the theory tests: an independent numpy SA-LN step."""

import math

import numpy as np
import pytest


def _numpy_step(system: dict, X: np.ndarray) -> np.ndarray:
    """Independent float64 SA-LN step from the printed system (row-vector convention)."""
    M = np.array(system["mask"], dtype=bool)
    WQ, WK, WV = (np.array(system[k], dtype=np.float64) for k in ("W_Q", "W_K", "W_V"))
    S = (X @ WQ) @ (X @ WK).T / math.sqrt(system["d_qk"])
    S = np.where(M, S, -np.inf)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    Y = A @ X @ WV
    return Y / np.linalg.norm(Y, axis=1, keepdims=True)


@pytest.fixture
def numpy_step():
    """``numpy_step(system_dict, X)``: one SA-LN step in numpy float64 from a printed
    system (``mask[i][j]`` = i attends to j, ``x ↦ x W_V``), independent of the package."""
    return _numpy_step
