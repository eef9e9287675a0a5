"""participation_scan: one query's participation ratio against a numpy softmax, closed
forms (β = 0: PR = N; a power law's slope), the uniform-sphere contrast of the laws, and
`rankcollapse theory temperature` through the CLI."""

import json

import numpy as np
import pytest
import torch

from rankcollapse.errors import ConfigError, MemoryLimitError
from rankcollapse.theory.temperature import _slope, participation_scan, query_participation
from tests.cli._harness import run_cli


def test_query_participation_matches_numpy():
    rng = np.random.default_rng(1)
    K, q = rng.normal(size=(3, 40, 4)), rng.normal(size=(3, 4))
    s = 2.5 * np.einsum("bnd,bd->bn", K, q)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    got = query_participation(torch.from_numpy(K), torch.from_numpy(q), 2.5)
    np.testing.assert_allclose(got.numpy(), 1 / (a ** 2).sum(-1), rtol=1e-12)
    assert torch.allclose(query_participation(torch.from_numpy(K), torch.from_numpy(q), 0.0),
                          torch.full((3,), 40.0, dtype=torch.float64), rtol=1e-13)  # β = 0: uniform over N keys


def test_slope_of_an_exact_power_law():
    rng = np.random.default_rng(0)
    sizes = [100, 1000, 10000]
    out = _slope([np.full(5, 3.0 * n ** 0.5) for n in sizes], sizes, rng)
    assert out["slope"] == pytest.approx(0.5, rel=1e-12)
    assert out["slope_lo"] == pytest.approx(0.5, rel=1e-12) and out["slope_hi"] == pytest.approx(0.5, rel=1e-12)
    assert np.isnan(_slope([np.ones(3)], [100], rng)["slope"])


def test_uniform_sphere_keys_pow_law_bounded_log_law_grows():
    """d = 3: β = N^{2/(d-1)} keeps PR bounded, β = ln N lets it grow almost like N."""
    scan = participation_scan(["pow:1", "log:1"], [300, 3000, 30000], d_model=3, n_queries=32, seed=0)
    slope = {s["law"]: s for s in scan.slopes}
    assert abs(slope["pow:1.0"]["slope"]) < 0.1 and slope["pow:1.0"]["slope_lo"] < 0 < slope["pow:1.0"]["slope_hi"]
    assert 0.7 < slope["log:1.0"]["slope_lo"] and slope["log:1.0"]["slope_hi"] < 1.0
    for r in scan.rows:
        assert 1 <= r["pr_lo"] <= r["pr_mean"] <= r["pr_hi"] <= r["n_tokens"]


def test_query_key_includes_the_query_itself():
    """With query = key 0, <q, q> = 1 is the top score: at large β the row is one-hot, PR -> 1."""
    scan = participation_scan(["log:50"], [200], d_model=8, n_queries=4, query="key")
    assert scan.rows[0]["pr_mean"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("kw", [dict(laws=["log:1"], n_tokens=[1]), dict(laws=["cube:1"], n_tokens=[10]),
                                dict(laws=["pow:1"], n_tokens=[10], d_model=1), dict(laws=[], n_tokens=[10]),
                                dict(laws=["log:1"], n_tokens=[10], query="all"),
                                dict(laws=["log:1"], n_tokens=[10], keys="cube")])
def test_refusals(kw):
    with pytest.raises(ConfigError):
        participation_scan(**kw)


def test_memory_is_checked_before_drawing():
    with pytest.raises(MemoryLimitError, match="one query"):
        participation_scan(["log:1"], [10**6], d_model=8, max_memory="1MiB")


def test_cli_json_and_refusal():
    p = run_cli("theory", "temperature", "--law", "log:1,pow:1", "--n-tokens", "100,1000", "--n-queries", "8",
                "--format", "json")
    assert p.returncode == 0, p.stderr
    obj = json.loads(p.stdout)
    assert [(r["n_tokens"], r["law"]) for r in obj["rows"]] == [(100, "log:1.0"), (100, "pow:1.0"),
                                                                (1000, "log:1.0"), (1000, "pow:1.0")]
    assert [s["law"] for s in obj["slopes"]] == ["log:1.0", "pow:1.0"]
    bad = run_cli("theory", "temperature", "--law", "pow:x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'pow:x': key 'c'" in bad.stderr and bad.stdout == ""


def test_cli_table_with_one_n_says_the_exponent_is_undefined():
    p = run_cli("theory", "temperature", "--law", "log:1", "--n-tokens", "100,100", "--n-queries", "2")
    assert p.returncode == 0, p.stderr
    assert "undefined with one N (give two or more --n-tokens)" in p.stdout and "nan" not in p.stdout.lower()
