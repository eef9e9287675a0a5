"""The temperature-law experiment: the temperature_law unit's rows (layer = log10 N, the
per-query values kept, its labels), refusals, and the claims' reading of a growth factor."""

import math

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import claims as C
from rankcollapse.experiments.table import rows_from_metrics
from rankcollapse.experiments.config import load_config
from rankcollapse.experiments.temperature_units import law_variant, run_temperature_law, temperature_law_rows
from rankcollapse.sweep.units import Unit

PARAMS = {"law": "log:0", "d_model": 3, "n_tokens": [10, 100], "n_queries": 4, "keys": "sphere", "query": "fresh",
          "draw_seed": 0}


def test_rows_are_one_per_decade_with_every_query():
    """β = 0 (log:0): uniform attention, PR = N exactly for every query."""
    rows = temperature_law_rows(PARAMS)
    assert list(rows["layer"]) == [1, 2] and list(rows["point"]) == ["n_tokens.10", "n_tokens.100"]
    assert set(rows["metric"]) == {"participation_ratio"}
    for n, vals, mean in zip((10, 100), rows["values"], rows["mean"]):
        np.testing.assert_allclose(vals, np.full(4, float(n)), rtol=1e-12)
        assert mean == pytest.approx(n, rel=1e-12)


def test_unit_labels():
    df = run_temperature_law(Unit("temperature_law", {**PARAMS, "seed": -1, "setting": "default"}, "laws"), None)
    assert set(df["variant"]) == {"log:0.0,d=3"} and set(df["source"]) == {"temperature_law"}
    assert set(df["model"]) == {"sphere"} and set(df["dtype"]) == {"float64"} and set(df["mask_spec"]) == {"complete"}
    assert law_variant("pow:1", 5) == "pow:1.0,d=5"


def test_n_tokens_not_a_power_of_ten_is_refused():
    with pytest.raises(ConfigError, match="powers of ten"):
        temperature_law_rows({**PARAMS, "n_tokens": [10, 300]})


def test_claim_thresholds_are_the_stated_exponents():
    claims = {c["id"]: c for c in load_config("laws")["claims"]}
    (l1,) = claims["L1"]["rule"]["checks"]
    (l2,) = claims["L2"]["rule"]["checks"]
    assert math.log10(l1["factor"]) == pytest.approx(0.1) and l1["op"] == "within"
    assert math.log10(l2["rhs"]["const"]) == pytest.approx(0.5) and l2["op"] == ">="


def _table(growth: dict[str, float]) -> pd.DataFrame:
    """Rows of every law the claims read: mean PR = 2 growth^(k - 3) at layer k = log10 N,
    eight queries spread by +-1 %."""
    spread = np.linspace(0.99, 1.01, 8)
    parts = []
    for law in ("log:0.0", "log:1.0", "pow:1.0", "pow:10.0", "ssmax:1.0", "llama4"):
        for d in (3, 5):
            g = growth[law]
            vals = np.array([2.0 * g ** (k - 3) for k in (3, 4, 5)])[:, None] * spread
            parts.append(rows_from_metrics({"participation_ratio": vals},
                                           {"source": "temperature_law", "variant": f"{law},d={d}", "mask": "complete",
                                            "mask_spec": "complete", "model": "sphere", "dtype": "float64", "depth": -1},
                                           layers=[3, 4, 5]))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.parametrize("present", [True, False])
def test_rules_pass_when_present_and_fail_when_absent(present):
    """Present: pow laws flat, logarithmic laws x7 per decade. Absent: the other way round."""
    flat, grows = 1.0, 7.0
    law = {"log:0.0": 10.0, "pow:10.0": 1.0}
    law.update({k: (flat if present else grows) for k in ("pow:1.0",)})
    law.update({k: (grows if present else flat) for k in ("log:1.0", "ssmax:1.0", "llama4")})
    table = _table(law)
    for claim in load_config("laws")["claims"]:
        res = C.evaluate_claim(table, claim, n_boot=200)
        assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced"), claim["id"]
