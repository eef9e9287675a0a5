"""Influence profiles (masks/influence.py): closed forms (Cesàro powers, the self term),
every fast path against dense numpy float64 products on named, random and scheduled
masks, the block-scan range sums against brute force and exactly rounded sums (relative
accuracy of entries spanning hundreds of orders of magnitude), the summary on hand-built
profiles, the refusals, and the CLI."""

import json
import math
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from rankcollapse.cli import run
from rankcollapse.errors import MaskError
from rankcollapse.masks import Mask, influence, parse_mask, parse_schedule
from rankcollapse.masks import interval_graph
from rankcollapse.masks.influence import MAX_ALL_TOKENS, summarize
from rankcollapse.masks.range_sums import SEQUENTIAL_SCAN, RangeSums

RTOL = 1e-11  # positive sums only, on both sides: relative error ~ depth * log2(N) * eps
TINY = np.finfo(np.float64).tiny


def dense_product(source, n, depth, alpha, decay=0.0):
    """Independent reference: ``P_H ... P_1`` from each layer's dense boolean mask
    (``alpha``: one weight, or one per layer)."""
    schedule = parse_schedule(source, n)
    alphas = list(alpha) if isinstance(alpha, (list, tuple)) else [alpha] * depth
    i, j = np.indices((n, n))
    prod = np.eye(n)
    for t in range(depth):
        w = schedule.layer(t).to_numpy() * np.exp(-decay * np.abs(i - j))
        p = alphas[t] * np.eye(n) + (1 - alphas[t]) * w / w.sum(1, keepdims=True)
        prod = p @ prod
    return prod


def assert_profiles_match(result, source, n, alpha, decay):
    for h in range(1, result.depth + 1):
        ref = dense_product(source, n, h, alpha[:h] if isinstance(alpha, list) else alpha, decay)[-1]
        np.testing.assert_allclose(result.profiles[h - 1], ref, rtol=RTOL, atol=TINY)


def cesaro(n):
    return np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]


# ---------------------------------------------------------------- closed forms
@pytest.mark.parametrize("n,depth", [(1, 3), (2, 1), (9, 4), (64, 7)])
def test_causal_is_cesaro_powers(n, depth):
    r = influence("causal", n, depth=depth, alpha=0.0, query="all")
    assert r.method == "intervals"
    c = cesaro(n)
    for h in range(1, depth + 1):
        np.testing.assert_allclose(r.profiles[h - 1], np.linalg.matrix_power(c, h)[-1], rtol=RTOL, atol=0)
    np.testing.assert_allclose(r.matrix, np.linalg.matrix_power(c, depth), rtol=RTOL, atol=0)


def test_cesaro_square_first_column_is_harmonic():
    # (C^2)[i, 0] = sum_k 1/(i+1) * 1/(k+1) = H_{i+1}/(i+1); (C^H)[N-1, N-1] = N^-H
    n = 40
    r = influence("causal", n, depth=2, alpha=0.0, query="all")
    harmonic = np.cumsum(1.0 / np.arange(1, n + 1))
    np.testing.assert_allclose(r.matrix[:, 0], harmonic / np.arange(1, n + 1), rtol=1e-13)
    big = influence("causal", 131072, depth=12, alpha=0.0)
    assert big.summary["last_token_mass"] == pytest.approx(131072.0 ** -12, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.9])
@pytest.mark.parametrize("decay", [0.0, 0.3])
def test_self_term_closed_form(alpha, decay):
    # P lower triangular: diag(P^H) = diag(P)^H, diag(P)_i = alpha + (1-alpha)/Z_i
    n, depth = 50, 6
    r = influence("causal", n, depth=depth, alpha=alpha, decay=decay, query="all")
    i = np.arange(n)
    z = (i + 1.0) if decay == 0 else -np.expm1(-decay * (i + 1)) / -math.expm1(-decay)
    expected = (alpha + (1 - alpha) / z) ** depth
    np.testing.assert_allclose(np.diag(r.matrix), expected, rtol=1e-12)
    assert r.summary["last_token_mass"] == pytest.approx(expected[-1], rel=1e-12)
    for h, row in enumerate(r.per_depth, start=1):
        assert row["last_token_mass"] == pytest.approx((alpha + (1 - alpha) / z[-1]) ** h, rel=1e-12)


def test_alpha_one_is_identity_and_rows_are_distributions():
    r = influence("sliding_window:w=5", 30, depth=4, alpha=1.0, query="all")
    np.testing.assert_array_equal(r.matrix, np.eye(30))
    assert r.summary["effective_horizon"] == 1
    r = influence("bigbird:w=3,globals=0,random=2", 30, depth=5, alpha=0.1, decay=0.2, query="all")
    np.testing.assert_allclose(r.matrix.sum(1), 1.0, rtol=1e-13)


# -------------------------------------------------------- fast paths vs dense
INTERVAL_SPECS = ["complete", "causal", "sliding_window:w=5", "sliding_window:w=1", "causal_sliding_window:w=4",
                  "prefix:k=3", "block:size=4", "block:size=4,causal=true", "documents:lengths=3+5+9,causal=true",
                  "documents:lengths=8+9"]


@pytest.mark.parametrize("spec", INTERVAL_SPECS)
@pytest.mark.parametrize("alpha,decay", [(0.0, 0.0), (0.35, 0.0), (0.0, 0.7), (0.5, 2.5)])
def test_interval_path_equals_dense(spec, alpha, decay):
    r = influence(spec, 17, depth=6, alpha=alpha, decay=decay)
    assert r.method == "intervals"
    assert_profiles_match(r, spec, 17, alpha, decay)


def test_random_patterns_equal_dense():
    rng = np.random.default_rng(29)
    for _ in range(12):
        seed, n = int(rng.integers(1000)), int(rng.integers(5, 40))
        spec = str(rng.choice([f"random:p=0.15,seed={seed}", f"bigbird:w=3,globals=0,random=2,seed={seed}",
                               "longformer:w=3,globals=0", f"strided:stride={int(rng.integers(2, 5))}",
                               "causal&sliding_window:w=5", "(causal|sliding_window:w=3)&block:size=6"]))
        alpha, decay = float(rng.uniform(0, 0.9)), float(rng.choice([0.0, rng.uniform(0, 2)]))
        r = influence(spec, n, depth=int(rng.integers(1, 7)), alpha=alpha, decay=decay, query="all")
        assert r.method == "csr"
        assert_profiles_match(r, spec, n, alpha, decay)
        np.testing.assert_allclose(r.matrix, dense_product(spec, n, r.depth, alpha, decay), rtol=RTOL, atol=TINY)


def test_random_schedules_equal_dense():
    pool = ["causal", "complete", "sliding_window:w=3", "causal_sliding_window:w=2", "prefix:k=4",
            "block:size=3,causal=true", "strided:stride=3", "random:p=0.2,seed=4"]
    rng = np.random.default_rng(7)
    for _ in range(12):
        layers = [f"{rng.choice(pool)}*{int(rng.integers(1, 3))}" for _ in range(int(rng.integers(2, 4)))]
        spec = "schedule:" + ",".join(layers)
        n, depth = int(rng.integers(4, 25)), int(rng.integers(1, 8))
        alpha, decay = float(rng.uniform(0, 0.8)), float(rng.choice([0.0, 0.5]))
        r = influence(spec, n, depth=depth, alpha=alpha, decay=decay, query="all")
        assert_profiles_match(r, spec, n, alpha, decay)
        np.testing.assert_allclose(r.matrix, dense_product(spec, n, depth, alpha, decay), rtol=RTOL, atol=TINY)


@pytest.mark.parametrize("spec", ["causal", "sliding_window:w=3", "strided:stride=3", "schedule:causal,complete"])
def test_per_layer_alphas_equal_dense(spec):
    alphas = [0.9, 0.1, 0.5, 0.0, 0.7]
    r = influence(spec, 13, depth=5, alpha=alphas, decay=0.2, query="all")
    assert r.alpha == alphas
    assert_profiles_match(r, spec, 13, alphas, 0.2)
    np.testing.assert_allclose(r.matrix, dense_product(spec, 13, 5, alphas, 0.2), rtol=RTOL, atol=TINY)
    with pytest.raises(MaskError, match="per-layer"):
        influence(spec, 13, depth=4, alpha=alphas)


def test_schedule_order_matters_and_is_layer_zero_first():
    # depth 2 of [causal, complete]: e_last P_complete P_causal, not P_causal P_complete
    n = 6
    r = influence("schedule:causal,complete", n, depth=2, alpha=0.0)
    expected = (np.full((n, n), 1.0 / n) @ cesaro(n))[-1]
    np.testing.assert_allclose(r.influence, expected, rtol=1e-13)
    assert not np.allclose(r.influence, (cesaro(n) @ np.full((n, n), 1.0 / n))[-1])


def test_window_tail_keeps_relative_accuracy():
    # a decayed window's far tail after 12 layers is ~1e-80: a difference of prefix sums
    # (absolute error ~eps of the mass) would lose it
    n, depth = 200, 12
    r = influence("causal_sliding_window:w=9", n, depth=depth, alpha=0.0, decay=2.0)
    ref = dense_product("causal_sliding_window:w=9", n, depth, 0.0, 2.0)[-1]
    tail = ref[ref > 0].min()
    assert tail < 1e-60
    np.testing.assert_allclose(r.influence, ref, rtol=RTOL, atol=0)


def test_causal_never_builds_its_csr():
    m = parse_mask("causal", 50_000)
    influence(m, depth=3, alpha=0.5, decay=0.01)
    assert not m.is_built


def test_range_sums_equal_brute_force():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 17, 64, 100, 256, 300):
        x = rng.random(n) * np.exp(-rng.uniform(0, 40, n))
        a = rng.integers(0, n, 50)
        starts = [a, a, np.zeros(50, dtype=np.int64), a, a + 1]
        ends = [rng.integers(0, n, 50), np.full(50, n - 1), rng.integers(0, n, 50),  # any, suffixes, prefixes
                np.minimum(a + rng.integers(0, 9, 50), n - 1), a]  # short windows, empty ranges
        for lo_, hi_ in zip(starts, ends):
            for r in (1.0, 0.6, 0.0):
                got = RangeSums(len(x), lo_, hi_, r)(x)
                want = [sum(x[i] * r ** (i - lo) for i in range(lo, hi + 1)) for lo, hi in zip(lo_, hi_)]
                np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


def test_range_sums_in_two_stages_equal_brute_force():
    # blocks longer than SEQUENTIAL_SCAN: running sums within sub-blocks, then their totals
    rng = np.random.default_rng(4)
    n = 2 * SEQUENTIAL_SCAN + 3
    x = rng.random(n) * np.exp(-rng.uniform(0, 40, n))
    a = rng.integers(0, n // 2, 20)
    for b in (np.full(20, n - 1), a + rng.integers(SEQUENTIAL_SCAN, n // 2, 20), np.minimum(a + 1500, n - 1)):
        for r in (1.0, 0.999, 0.6):
            want = [math.fsum(x[lo:hi + 1] * r ** np.arange(hi + 1 - lo)) for lo, hi in zip(a, b)]
            np.testing.assert_allclose(RangeSums(len(x), a, b, r)(x), want, rtol=1e-12, atol=0)
    keys = np.arange(n)
    for r in (1.0, 0.999):  # every suffix, and every window of 1,500
        for lo, hi in [(keys, np.full(n, n - 1)), (keys, np.minimum(keys + 1500, n - 1))]:
            want = [math.fsum(x[i:j + 1] * r ** np.arange(j + 1 - i)) for i, j in zip(lo[::97], hi[::97])]
            np.testing.assert_allclose(RangeSums(len(x), lo, hi, r)(x)[::97], want, rtol=1e-12, atol=0)


def test_every_suffix_written_into_out_is_the_same_scan():
    """Every suffix (``RangeSums(n, None, None)``) written into ``out``, the second stage adding
    the block carries straight into it, has the bits of the scan returned without ``out``,
    whether the scan's blocks align with ``out`` (n = M, and M - n one sub-block) or not."""
    rng = np.random.default_rng(6)
    for n in (2048, 2048 - 64, 2000):  # M = 2048, sub-blocks of 64
        x = rng.random(n) * np.exp(-rng.uniform(0, 40, n))
        plan = RangeSums(n, None, None)
        scan = plan(x).copy()
        out = np.empty(n)
        assert plan(x, out=out) is out
        np.testing.assert_array_equal(out, scan)
        np.testing.assert_array_equal(RangeSums(n, np.arange(n), np.full(n, n - 1))(x), scan)
        want = [math.fsum(x[i:]) for i in range(0, n, 37)]
        np.testing.assert_allclose(scan[::37], want, rtol=1e-12, atol=0)


def _exact_range_sums(x, a, b):
    return np.array([math.fsum(x[lo:hi + 1]) for lo, hi in zip(a, b)])  # correctly rounded


@pytest.mark.parametrize("n", [1000, 3 * SEQUENTIAL_SCAN + 5])
def test_range_sums_keep_relative_accuracy_of_tiny_sums(n):
    """Entries spanning ~300 orders of magnitude: every sum, 1e-300 included, within the
    documented bound (S + 1) eps / 2 of its correctly rounded value (S the longest running
    sum); a difference of prefix sums would leave the small ones with an error ~eps of the
    largest."""
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.0, n) * np.exp(-np.linspace(0.0, 690.0, n))  # 1 down to ~1e-300
    m = 1 << (n - 1).bit_length()
    longest = max(min(m, SEQUENTIAL_SCAN), 2 * math.sqrt(m) + 2)
    bound = (longest + 1) * np.finfo(np.float64).eps / 2
    keys = np.arange(n)
    cases = [(keys, np.full(n, n - 1)),  # every suffix (the causal mask)
             (np.maximum(keys - 128, 0), np.minimum(keys + 128, n - 1)),  # a window of 257
             (keys, np.minimum(keys + rng.integers(0, n // 3, n), n - 1))]  # ragged ranges
    some = slice(None, None, max(1, n // 500))  # the reference at ~500 ranges
    for a, b in cases:
        want = _exact_range_sums(x, a[some], b[some])
        assert want.min() < 1e-250
        got = RangeSums(len(x), a, b)(x)[some]
        assert np.all(np.abs(got - want) <= bound * want)


def test_range_sums_plans_are_linear():
    """A window takes one block size and the causal mask's suffixes one scan: the scans
    hold at most two copies of the padded vector."""
    n = 5000
    m = 1 << (n - 1).bit_length()
    for spec in ["causal", "sliding_window:w=257", "causal_sliding_window:w=64", "complete"]:
        lo, hi = parse_mask(spec, n).intervals
        plan = RangeSums(n, *interval_graph.reverse(lo, hi))
        assert len(plan.levels) == 1, spec
        assert plan.buffer.shape[0] <= 3 * m + 1, spec


@pytest.mark.parametrize("spec", ["causal", "sliding_window:w=37", "causal_sliding_window:w=20", "prefix:k=50",
                                  "block:size=24", "documents:lengths=7+90+3+100+40+60,causal=true",
                                  "documents:lengths=150+150"])
@pytest.mark.parametrize("alpha,decay", [(0.0, 0.0), (0.3, 0.05)])
def test_interval_path_equals_dense_at_300_tokens(spec, alpha, decay):
    # several block sizes, rows and runs of the plans; tails far below the mass
    r = influence(spec, 300, depth=6, alpha=alpha, decay=decay)
    assert r.method == "intervals"
    assert_profiles_match(r, spec, 300, alpha, decay)


def test_horizon_is_the_running_sum_from_the_end():
    from rankcollapse.masks.influence import _horizon

    rng = np.random.default_rng(11)
    for n in (1, 7, 4096, 4097, 30000, 70001):
        p = rng.random(n) * np.exp(-rng.uniform(0, 50, n))
        p[rng.integers(0, n, 3)] = 0.0
        running = np.cumsum(p[::-1])
        # masses on and next to the running sums themselves, where only the sequential sum decides
        exact = [float(running[k]) for k in rng.integers(0, n, 4)]
        near = [np.nextafter(m, np.inf) for m in exact] + [np.nextafter(m, -np.inf) for m in exact]
        for mass in [share * float(p.sum()) for share in (0.0, 0.3, 0.5, 0.99, 1.0, 2.0)] + exact + near:
            want = min(int(np.searchsorted(running, mass, side="left")) + 1, n)
            assert _horizon(p, mass) == want


# ------------------------------------------------------------------- summary
def test_summary_on_hand_built_profile():
    p = np.array([0.5, 0.05, 0.0, 0.02, 0.03, 0.4])
    s = summarize(p, epsilon=0.1)
    assert s["first_token_mass"] == 0.5 and s["last_token_mass"] == 0.4
    assert s["valley_position"] == 3 and s["valley_mass"] == 0.02  # the zero is outside the support
    assert s["n_support"] == 5 and s["valley_ratio"] == pytest.approx(0.1)
    # most recent mass: 0.4, 0.43, 0.45, 0.45, 0.5, 1.0 -> 0.9 needs all 6
    assert s["effective_horizon"] == 6
    assert summarize(p, epsilon=0.6)["effective_horizon"] == 1
    assert summarize(p, epsilon=0.55)["effective_horizon"] == 3  # 0.45 >= 0.45


def test_window_horizon_is_bounded_by_its_reach():
    # H layers of a causal window of width w reach H (w - 1) positions back
    r = influence("causal_sliding_window:w=5", 400, depth=6, alpha=0.3)
    assert r.summary["n_support"] == 6 * 4 + 1
    assert r.summary["effective_horizon"] <= 25


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("kwargs,match", [
    ({"alpha": -0.1}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"alpha": float("nan")}, "alpha"),
    ({"decay": -1.0}, "decay"), ({"epsilon": 0.0}, "epsilon"), ({"epsilon": 1.0}, "epsilon"),
    ({"query": "first"}, "query"), ({"depth": 0}, "depth"),
])
def test_refusals(kwargs, match):
    args = {"depth": 2, "alpha": 0.5} | kwargs
    with pytest.raises(MaskError, match=match):
        influence("causal", 10, **args)


def test_all_refused_above_limit_and_n_needed_for_spec():
    with pytest.raises(MaskError, match="at most N"):
        influence("causal", MAX_ALL_TOKENS + 1, depth=1, alpha=0.0, query="all")
    with pytest.raises(MaskError, match="n_tokens is needed"):
        influence("causal", depth=1, alpha=0.0)
    with pytest.raises(MaskError, match="N=5"):
        influence(Mask.from_dense(np.eye(5, dtype=bool)), 6, depth=1, alpha=0.0)


# ----------------------------------------------------------------------- CLI
def _cli(*argv):
    with CliRunner().isolation() as streams:
        code = run(list(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        return code, streams[0].getvalue().decode(), streams[1].getvalue().decode()


def test_cli_json_and_plot(tmp_path):
    png = tmp_path / "influence.png"
    code, out, err = _cli("mask", "influence", "causal", "--n-tokens", "12", "--depth", "3", "--alpha", "0.25",
                          "--format", "json", "--plot", str(png))
    assert code == 0, err
    d = json.loads(out)
    ref = influence("causal", 12, depth=3, alpha=0.25)
    assert d["influence"] == ref.influence.tolist() and len(d["influence"]) == 12
    assert d["summary"] == ref.summary and [row["depth"] for row in d["per_depth"]] == [1, 2, 3]
    assert png.stat().st_size > 0
    code, out, _ = _cli("mask", "influence", "schedule:causal*2,complete", "--n-tokens", "5", "--depth", "3",
                        "--alpha", "0", "--query", "all", "--format", "json")
    assert code == 0
    np.testing.assert_allclose(json.loads(out)["matrix"], dense_product("schedule:causal*2,complete", 5, 3, 0.0),
                               rtol=1e-13)


def test_cli_npy_file_fixes_n(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save("m.npy", np.tril(np.ones((7, 7), dtype=bool)))
    code, out, err = _cli("mask", "influence", "file:m.npy", "--depth", "2", "--alpha", "0", "--format", "json")
    assert code == 0, err
    np.testing.assert_allclose(json.loads(out)["influence"], np.linalg.matrix_power(cesaro(7), 2)[-1], rtol=1e-13)
    code, _, err = _cli("mask", "influence", "causal", "--depth", "2", "--alpha", "0")
    assert code == 2 and "--n-tokens is needed" in err


def test_cli_table_and_errors():
    code, out, _ = _cli("mask", "influence", "sliding_window:w=3", "--n-tokens", "9", "--depth", "2",
                        "--alpha", "0.5", "--decay", "0.1")
    assert code == 0 and "effective_horizon" in out
    for argv, match in [(["--alpha", "2"], "alpha"), (["--alpha", "0.5", "--query", "all"], "--format json"),
                        (["--alpha", "0.5", "--plot", "x.txt"], "--plot"), (["--alpha", "0.5", "--epsilon", "1"],
                                                                            "epsilon")]:
        code, out, err = _cli("mask", "influence", "causal", "--n-tokens", "9", "--depth", "2", *argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and match in err


@pytest.mark.parametrize("spec", ["causal", "sliding_window:w=5"])
def test_a_decay_past_float64_range_gives_the_one_hot_self_profile(spec):
    """exp(-m) underflows to 0 for m > ~745: every row keeps only its own key."""
    from rankcollapse.masks.influence import influence as infl

    for m in (746.0, 1000.0):
        prof = np.asarray(infl(spec, 16, depth=3, alpha=0.5, decay=m).to_dict()["influence"])
        assert prof[-1] == 1.0 and (prof[:-1] == 0).all()
