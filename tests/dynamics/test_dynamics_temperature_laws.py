"""Temperature laws: parsing to canonical strings, β against the formulas written out,
Llama 4's scale against transformers' expression evaluated in torch, refusals."""

import math

import pytest
import torch

from rankcollapse.dynamics.temperature_laws import LAWS, TemperatureLaw, is_law, llama4_scale, parse_law
from rankcollapse.errors import ConfigError


def test_parse_to_canonical_specs():
    assert parse_law("log:2").spec == "log:2.0" and parse_law("pow:1").spec == "pow:1.0"
    assert parse_law("ssmax:0.5") == TemperatureLaw("ssmax", 0.5) and parse_law("llama4").spec == "llama4"
    assert is_law("log:1") and is_law("llama4") and not is_law("1.5") and not is_law(1.5)
    assert set(LAWS) == {"log", "pow", "ssmax", "llama4"}
    # NAME:value is short for the law's one key
    assert parse_law("log:gamma=2") == parse_law(" log : 2 ") == TemperatureLaw("log", 2.0)
    assert parse_law("pow:c=1.5") == TemperatureLaw("pow", 1.5) and parse_law("ssmax:s=0") == TemperatureLaw("ssmax", 0.0)


@pytest.mark.parametrize("text, match", [
    ("log", "needs key 'gamma'"), ("pow:", "needs key 'c'"), ("pow:-1", "must be >= 0"),
    ("ssmax:nan", "finite"), ("log:inf", "finite"), ("llama4:2", "expected key=value"), ("tanh:1", "unknown"),
    ("log:x", "must be a finite number"), ("log:c=1", "has no key 'c'"), ("log:1,2", "expected key=value"),
    ("log:gamma=1,gamma=2", "given twice")])
def test_bad_laws_are_refused(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_law(text)


def test_beta_closed_forms():
    assert parse_law("log:2").beta(1000, 3) == pytest.approx(2 * math.log(1000), rel=1e-15)
    assert parse_law("pow:1").beta(10_000, 3) == pytest.approx(10_000.0, rel=1e-15)  # N^{2/(3-1)} = N
    assert parse_law("pow:2").beta(10_000, 5) == pytest.approx(200.0, rel=1e-15)  # 2 N^{1/2}
    assert parse_law("ssmax:1").beta(100, 4) == pytest.approx(math.log(100) / 2, rel=1e-15)
    assert parse_law("ssmax:3").beta(50, 7) == pytest.approx(parse_law(f"log:{3 / math.sqrt(7)}").beta(50, 7), rel=1e-14)
    with pytest.raises(ConfigError, match="d_model >= 2"):
        parse_law("pow:1").beta(10, 1)


def test_llama4_matches_transformers_expression():
    """scale(p) = log1p(floor((p + 1) / 8192)) * 0.1 + 1 as Llama4TextAttention computes it."""
    positions = torch.tensor([0, 8190, 8191, 16382, 16383, 100_000, 1_000_000])
    want = torch.log1p(torch.floor((positions.double() + 1.0) / 8192)) * 0.1 + 1.0
    got = torch.tensor([llama4_scale(int(p)) for p in positions], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-15)
    assert got[:2].tolist() == [1.0, 1.0] and got[2] == pytest.approx(1 + 0.1 * math.log(2))
    law = parse_law("llama4")
    assert law.beta(8192, 4) == pytest.approx((1 + 0.1 * math.log(2)) / 2)  # the last query, position 8191
    assert law.beta(8192, 4, position=0) == 0.5
    assert not law.varies_with_position(8191) and law.varies_with_position(8192)
    assert not parse_law("log:1").varies_with_position(10**6)
