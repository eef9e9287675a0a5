"""Tidy-table statistics against numpy references."""

import numpy as np
import pytest
import torch

from rankcollapse.experiments.table import rows_from_metrics, summarise


def test_summarise_matches_numpy():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(5, 40))
    s = summarise(torch.from_numpy(v))
    assert s["mean"] == pytest.approx(v.mean(1))
    assert s["std"] == pytest.approx(v.std(1))
    for name, q in (("q05", 0.05), ("q25", 0.25), ("q50", 0.5), ("q75", 0.75), ("q95", 0.95)):
        assert s[name] == pytest.approx(np.quantile(v, q, axis=1))
    assert (s["n_samples"] == 40).all()


def test_summarise_ignores_nan():
    s = summarise(np.array([[1.0, np.nan, 3.0]]))
    assert s["mean"][0] == 2.0 and s["n_samples"][0] == 2


def test_rows_from_metrics_layout():
    df = rows_from_metrics({"mu": np.ones((3, 2)), "mu_relative": np.zeros((3, 2))}, {"mask": "causal", "seed": 4})
    assert len(df) == 6
    assert df["layer"].tolist() == [0, 1, 2, 0, 1, 2]
    # one naming scheme with probes: layer = layers applied, point = module path
    assert df["point"].tolist()[:3] == ["embeddings", "layer.0.output", "layer.1.output"]
    assert df["layer"].tolist()[:3] == [0, 1, 2]
    assert set(df["mask"]) == {"causal"} and set(df["seed"]) == {4}
