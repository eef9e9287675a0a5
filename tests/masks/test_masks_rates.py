"""Theorem-1 envelope, epsilon bound and the mask comparison table."""

import math

import numpy as np
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.theory.rates import compare_masks
from rankcollapse.theory.envelope import (
    collapse_envelope,
    epsilon_lower_bound,
    log10_layers_per_decade,
    log_contraction,
)


def test_envelope_closed_form():
    t = np.arange(6)
    np.testing.assert_allclose(collapse_envelope(t, 0.5, 2), (1 - 0.25) ** (t / 2), rtol=1e-14)
    np.testing.assert_allclose(collapse_envelope(t, 0.5, 2, exponent="t/(2r)", C=3.0),
                               3.0 * (1 - 0.25) ** (t / 4), rtol=1e-14)
    assert collapse_envelope(0, 0.1, 5) == 1.0


def test_log_space_for_tiny_eps_r():
    # eps^r = 1e-1000: per-layer log factor is -eps^r / r, finite in log10 terms
    eps, r = 1e-10, 100
    lf = log_contraction(eps, r)
    assert lf <= 0.0
    lpd = log10_layers_per_decade(eps, r)
    assert lpd == pytest.approx(math.log10(math.log(10)) + 1000 + math.log10(r), rel=1e-12)
    # agrees with the direct formula where it is representable
    assert log10_layers_per_decade(0.3, 2) == pytest.approx(
        math.log10(math.log(10) / (-math.log1p(-0.09) / 2)), rel=1e-12)


def test_epsilon_bound_is_a_lower_bound_on_real_attention():
    from rankcollapse.dynamics.attention import attention_weights
    from rankcollapse.masks import parse_mask

    g = __import__("torch").Generator().manual_seed(0)
    import torch

    m = parse_mask("causal_sliding_window:w=3", 12)
    X = torch.randn(12, 4, generator=g, dtype=torch.float64)
    X = X / X.norm(dim=1, keepdim=True)  # R = 1
    W_Q = torch.randn(4, 4, generator=g, dtype=torch.float64)
    W_K = torch.randn(4, 4, generator=g, dtype=torch.float64)
    C = max(torch.linalg.matrix_norm(W_Q, ord=2), torch.linalg.matrix_norm(W_K, ord=2)).item()
    for d_qk in (1 / 64, 1.0, 64.0):
        A = attention_weights(X, m.to_dense(), W_Q, W_K, d_qk=d_qk)
        eps = epsilon_lower_bound(d_qk=d_qk, token_norm=1.0, weight_norm=C, max_in_degree=3)
        assert A[m.to_dense()].min().item() >= eps
    assert epsilon_lower_bound(d_qk=1.0, token_norm=0.0, weight_norm=1.0, max_in_degree=4) == 0.25


def test_compare_table():
    df = compare_masks(["complete", "causal_sliding_window:w=4", "documents:lengths=4+5"], 9)
    assert df["radius"].tolist()[:2] == [1, 3] and df["radius"].isna().tolist() == [False, False, True]
    assert df.loc[0, "epsilon_bound"] == pytest.approx(math.exp(-2) / 9)
    assert df.loc[1, "epsilon_bound"] == pytest.approx(math.exp(-2) / 4)
    assert math.isnan(df.loc[2, "log10_factor"])
    # larger radius: slower guaranteed rate
    assert df.loc[1, "log10_layers_per_decade"] > df.loc[0, "log10_layers_per_decade"]


def test_bad_parameters():
    with pytest.raises(ConfigError, match="epsilon"):
        log_contraction(1.0, 2)
    with pytest.raises(ConfigError, match="radius"):
        collapse_envelope([1], 0.5, 0)
    with pytest.raises(ConfigError, match="exponent"):
        collapse_envelope([1], 0.5, 1, exponent="t")
    with pytest.raises(ConfigError, match="d_qk"):
        epsilon_lower_bound(d_qk=0, token_norm=1, weight_norm=1, max_in_degree=1)


def test_rates_live_in_theory_only():
    import rankcollapse.masks as masks

    for name in ("compare_masks", "compare_schedules", "describe_schedule"):
        assert name not in masks.__all__
        with pytest.raises(AttributeError):
            getattr(masks, name)


def test_importing_masks_does_not_import_theory_or_dynamics():
    import subprocess
    import sys

    code = ("import sys, rankcollapse.masks as m; m.parse_mask('causal', 4); m.analyze(m.causal(4)); "
            "import rankcollapse.masks.schedule; "
            "print(sorted(k for k in sys.modules if k.startswith(('rankcollapse.theory', 'rankcollapse.dynamics'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
