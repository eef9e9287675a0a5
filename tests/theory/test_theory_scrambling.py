"""The scrambling length L of a schedule (docs/theory.md §7): its definition against a
brute-force reference, hand-computed schedules, the bound μ(t) ≤ K (1 - ε^L)^⌊t/L⌋ on
random QSC schedules, and a schedule's bound not depending on how it is written."""

import math

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import gaussian_tokens
from rankcollapse.errors import ConfigError
from rankcollapse.masks import Mask
from rankcollapse.masks.schedule import MaskSchedule, parse_schedule
from rankcollapse.theory.rates import compare_schedules
from rankcollapse.theory import (
    check_schedule_bound, envelope_crossing_depth, envelope_rate, scrambling_length, theorem1_terms,
)
from rankcollapse.theory.envelope import epsilon_lower_bound, log_contraction


def _rooted_windows(masks: list[np.ndarray], length: int) -> bool:
    """The definition, read literally: every window of ``length`` layers at every phase
    composes (numpy integer products) to a graph with a column of all nonzeros."""
    p, n = len(masks), masks[0].shape[0]
    for s in range(p):
        P = np.eye(n, dtype=np.int64)
        for t in range(s, s + length):
            P = (masks[t % p].astype(np.int64) @ P > 0).astype(np.int64)
        if not (P > 0).all(axis=0).any():
            return False
    return True


def _reference_length(masks: list[np.ndarray], cap: int) -> int | None:
    return next((L for L in range(1, cap + 1) if _rooted_windows(masks, L)), None)


@pytest.mark.parametrize("spec, n, L, pr", [
    ("schedule:complete*5", 16, 1, 5),
    ("schedule:causal*3", 16, 1, 3),
    # window of 3 reaches 2 tokens back per layer: phase 0 needs w, w, causal
    ("schedule:causal_sliding_window:w=3*2,causal", 16, 3, 3),
    # Gemma-3 style at N = 64: five windows of 14 reach 5 * 13 = 65 >= 63 tokens, four reach 52
    ("schedule:causal_sliding_window:w=14*5,causal", 64, 5, 6),
    ("schedule:causal_sliding_window:w=20*5,causal", 64, 4, 6),  # four windows reach 76
    ("schedule:causal_sliding_window:w=3*5,causal", 32, 6, 6),
    ("causal_sliding_window:w=4", 20, 7, 7),  # a mask: L = r = ceil(19 / 3)
])
def test_hand_computed_lengths(spec, n, L, pr):
    terms = theorem1_terms(spec, n)
    assert (terms.scrambling_length, terms.period_radius, terms.effective_radius) == (L, pr, min(L, pr))
    assert scrambling_length(spec, n) == L
    sched = parse_schedule(spec, n)
    assert _reference_length([m.to_dense().numpy() for m in sched.masks], 2 * pr) == L


def test_period_bound_wins_when_it_is_shorter():
    # N = 3, layer 0: token 1 attends 0; layer 1: token 2 attends 1 (self-loops everywhere).
    # H = M1 M0 has 0 -> 1, 0 -> 2: r_H = 1, p r_H = 2. A window starting at layer 1
    # (M0 after M1) needs three layers before 0 reaches 2: L = 3 > p r_H.
    eye = np.eye(3, dtype=bool)
    m0, m1 = eye.copy(), eye.copy()
    m0[1, 0] = True
    m1[2, 1] = True
    sched = MaskSchedule([Mask.from_dense(m0, "a"), Mask.from_dense(m1, "b")])
    terms = theorem1_terms(sched)
    assert (terms.radius, terms.period_radius, terms.scrambling_length, terms.effective_radius) == (1, 2, 3, 2)
    assert _reference_length([m0, m1], 6) == 3


def test_no_length_without_qsc_or_self_loops():
    assert scrambling_length("schedule:block:size=4*2", 8) is None
    no_loop = np.zeros((3, 3), dtype=bool)
    no_loop[:, 0] = True  # everyone attends token 0 only
    assert theorem1_terms(MaskSchedule([Mask.from_dense(no_loop, "star")] * 2)).scrambling_length is None
    with pytest.raises(ConfigError, match="self-loops"):
        envelope_rate(MaskSchedule([Mask.from_dense(no_loop, "star")] * 2))


def test_same_network_same_bound():
    """complete and complete*5 (and causal, causal*3) are the same network: same bound."""
    specs = ["schedule:complete", "schedule:complete*5", "schedule:causal*3", "causal"]
    df = compare_schedules(specs, 16)
    eps = math.exp(-2) / 16
    assert df["effective_radius"].tolist() == [1, 1, 1, 1]
    np.testing.assert_allclose(df["log10_rate_per_layer"].astype(float), math.log10(1 - eps), rtol=1e-12)
    assert df["rank_predicted"].tolist() == [1, 1, 1, 1]
    assert envelope_rate("schedule:complete*5", n_tokens=16) == envelope_rate("complete", n_tokens=16) == pytest.approx(15 / 16, rel=1e-15)
    a, b = envelope_crossing_depth("complete", 0.01, n_tokens=16), envelope_crossing_depth("schedule:complete*5", 0.01, n_tokens=16)
    assert a.depth == b.depth and (b.period, b.scrambling_length, b.radius) == (5, 1, 1)


def test_gemma3_rate_uses_the_scrambling_length():
    df = compare_schedules(["schedule:causal_sliding_window:w=14*5,causal"], 64)
    eps = epsilon_lower_bound(d_qk=1.0, token_norm=1.0, weight_norm=1.0, max_in_degree=64)
    assert df.loc[0, "effective_radius"] == 5
    assert df.loc[0, "log10_rate_per_layer"] == pytest.approx(log_contraction(eps, 5) / math.log(10), rel=1e-12)


_LAYERS = ["causal_sliding_window:w=2", "causal_sliding_window:w=3", "causal", "sliding_window:w=3",
           "complete", "random:p=0.1,seed=4", "random:p=0.3,seed=1", "block:size=3", "prefix:k=2"]


def _random_qsc_schedules(count: int):
    """The first ``count`` random schedules (fixed seeds) whose composed graph is QSC."""
    rng = np.random.default_rng(25)
    while count:
        k = int(rng.integers(1, 4))
        spec = "schedule:" + ",".join(f"{_LAYERS[i]}*{int(rng.integers(1, 4))}" for i in rng.integers(0, len(_LAYERS), k))
        n = int(rng.integers(4, 14))
        if theorem1_terms(spec, n).quasi_strongly_connected:
            count -= 1
            yield spec, n, float(rng.choice([1.0, 3.0]))


@pytest.mark.parametrize("spec, n, qk_scale", list(_random_qsc_schedules(11)))
def test_scrambling_envelope_holds_on_random_schedules(spec, n, qk_scale):
    terms = theorem1_terms(spec, n)
    L = terms.scrambling_length
    assert L == _reference_length([m.to_dense().numpy() for m in parse_schedule(spec, n).masks], 2 * terms.period_radius)
    depth, B = 40, 4
    X0 = gaussian_tokens(B, n, 8, seed=3, std=1 / math.sqrt(8)).to(torch.float64)
    res = check_schedule_bound(spec, n_tokens=n, d_model=8, depth=depth, n_samples=B, seed=3, qk_scale=qk_scale, X0=X0)
    assert res.n_violations == 0 and res.config["scrambling_agrees"] is True and res.config["support_agrees"] is True
    assert res.config["scrambling_length"] == L and res.config["effective_radius"] == terms.effective_radius
    # the L-envelope alone, in its tighter floor form: K (1 - eps^L)^floor(t / L)
    osc = X0.amax(1) - X0.amin(1)
    K = math.sqrt(n) / 2 * torch.linalg.vector_norm(osc, dim=1)
    t = torch.arange(depth + 1, dtype=torch.float64).unsqueeze(1)
    bound = K * (1 - res.epsilon_measured**L) ** torch.div(t, L, rounding_mode="floor")
    assert bool((res.mu <= bound * (1 + 1e-9)).all())


@pytest.mark.parametrize("spec, n", [("schedule:causal_sliding_window:w=4*3,causal", 40),
                                     ("schedule:sliding_window:w=5*2,block:size=4,causal_sliding_window:w=2", 24),
                                     ("schedule:prefix:k=3,causal_sliding_window:w=3*4", 30)])
def test_interval_and_sparse_paths_agree(spec, n):
    """Interval masks compose in O(N); the same masks as plain CSR go through sparse products."""
    sched = parse_schedule(spec, n)
    assert sched.intervals() is not None and sched.composed().intervals is not None
    plain = MaskSchedule([Mask.from_csr(m.to_csr(), m.spec) for m in sched.masks])
    assert plain.intervals() is None
    assert np.array_equal(plain.composed().to_dense().numpy(), sched.composed().to_dense().numpy())
    assert theorem1_terms(plain) == theorem1_terms(sched)


def test_long_sequence_from_intervals():
    # N = 2^20: five windows of 1024 reach 5115 tokens back, so only the causal layer roots a
    # window: L = 6 = p r_H, found without building any N x N form
    sched = parse_schedule("schedule:causal_sliding_window:w=1024*5,causal", 1 << 20)
    terms = theorem1_terms(sched)
    assert (terms.radius, terms.scrambling_length, terms.effective_radius) == (1, 6, 6)
    assert not sched.composed().is_built and not any(m.is_built for m in sched.masks)
