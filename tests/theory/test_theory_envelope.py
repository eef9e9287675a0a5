"""The Theorem-1 envelope of a mask before a run: rate and threshold-crossing depth,
against hand-computed cases, a brute-force reference and a measured run."""

import math

import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.theory import check_collapse_bound, envelope_crossing_depth, envelope_rate


def _brute_force(N, r, eps, tau, cap=10_000):
    """Least t with sqrt(N) (1 - eps^r)^(t/r - 1) <= tau, by walking t."""
    for t in range(cap + 1):
        if math.sqrt(N) * (1 - eps**r) ** (t / r - 1) <= tau:
            return t
    return None


def test_complete_mask_by_hand():
    # N = 4, r = 1, deg_max = 4, eps = 1/4: E(t) = 2 (3/4)^(t-1); E(19) = 0.01127, E(20) = 0.00845
    res = envelope_crossing_depth("complete", 0.01, n_tokens=4)
    assert (res.radius, res.epsilon, res.depth, res.capped) == (1, 0.25, 20, False)
    assert res.rate == pytest.approx(0.75, abs=1e-15)
    assert res.exact_depth == pytest.approx(1 + math.log(200) / math.log(4 / 3), rel=1e-12)  # 19.417


def test_radius_two_by_hand():
    # causal window w=2 on 3 tokens: radius 2, deg_max 2, eps^r = 1/4, rate sqrt(3/4);
    # t/2 - 1 >= ln(0.01 / sqrt 3) / ln(3/4) = 17.918 -> t >= 37.84 -> 38
    res = envelope_crossing_depth("causal_sliding_window:w=2", 0.01, n_tokens=3)
    assert (res.radius, res.depth) == (2, 38)
    assert res.rate == pytest.approx(math.sqrt(0.75), abs=1e-15)
    assert envelope_rate("causal_sliding_window:w=2", n_tokens=3) == pytest.approx(math.sqrt(0.75), abs=1e-15)


@pytest.mark.parametrize("spec, n, tau, eps", [("complete", 16, 1e-3, None), ("causal", 8, 0.1, None),
                                               ("sliding_window:w=3", 9, 0.01, None), ("complete", 8, 0.01, 0.05)])
def test_matches_brute_force(spec, n, tau, eps):
    res = envelope_crossing_depth(spec, tau, n_tokens=n, epsilon=eps)
    assert res.depth == _brute_force(n, res.radius, res.epsilon, tau)


def test_window_at_n128_is_capped():
    # radius 16, eps = 1/9: eps^r = 5.4e-16, so the envelope needs ~1e17 layers
    res = envelope_crossing_depth("sliding_window:w=9", 0.01, n_tokens=128)
    assert res.radius == 16 and res.capped and res.depth == 4096 and res.exact_depth > 1e16
    assert envelope_crossing_depth("sliding_window:w=9", 0.01, n_tokens=128, cap=100).depth == 100


def test_default_epsilon_gives_the_fastest_rate_any_run_has():
    # a measured trajectory's smallest entry is at most 1/deg_max, so its envelope is slower
    res = check_collapse_bound("complete", n_tokens=8, d_model=8, depth=10, n_samples=4, seed=0)
    assert float(res.epsilon_measured.max()) <= 1 / 8
    assert res.envelope_rate >= envelope_rate("complete", n_tokens=8)


@pytest.mark.parametrize("kwargs, match", [({"threshold": 1.5}, "threshold"), ({"threshold": 0.1, "epsilon": 0.0}, "epsilon"),
                                           ({"threshold": 0.1, "cap": 0}, "cap")])
def test_bad_input(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        envelope_crossing_depth("complete", n_tokens=4, **kwargs)


def test_mask_without_theorem():
    with pytest.raises(ConfigError, match="quasi-strongly connected"):
        envelope_crossing_depth("sliding_window:w=1", 0.1, n_tokens=4)
