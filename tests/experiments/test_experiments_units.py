"""Shared random-init weights give exactly the numbers ``simulate`` draws itself; windows
beyond ``depth_check_windows`` run to the claim depth only, with the same numbers there; a
failed probe of a model without components is no rows, never a made-up data row."""

import importlib

import numpy as np
import pandas as pd
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.experiments.units import run_probe, run_simulate
from rankcollapse.sweep.context import RunContext
from rankcollapse.sweep.units import Unit


class TinyContext(RunContext):
    """Run context with small random X(0) instead of model embeddings."""

    def __init__(self, n_windows=3):
        super().__init__({"corpus": "wikipedia", "n_tokens": 6, "seed": 0})
        self.X0 = torch.randn(n_windows, 6, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def embeddings(self, model, n_samples, *, start=0, stop=None):
        return self.X0[start:stop]


@pytest.mark.parametrize("variant, value, init_scale", [("pure", "gaussian", 1.0), ("post_ln", "orthogonal", 2.0)])
def test_shared_weights_match_simulate_own_draw(variant, value, init_scale):
    ctx = TinyContext()
    params = {"model": "m", "mask": "causal", "variant": variant, "value": value, "init_scale": init_scale,
              "d_qk": 1.0, "depth": 4, "n_samples": 3, "seed": 7, "dtype": "float64", "metrics": ["mu", "mu_relative"]}
    got = run_simulate(Unit("simulate", params, "t"), ctx)
    again = run_simulate(Unit("simulate", {**params, "mask": "complete"}, "t"), ctx)  # reuses the draw
    assert len(ctx._weights) == 1
    qk = {} if init_scale == 1.0 else {"query_key": f"gaussian:std={init_scale / 8 ** 0.5!r}"}
    for mask, df in (("causal", got), ("complete", again)):
        ref = simulate(ctx.X0, mask=mask, value=value, metrics=["mu", "mu_relative"], block=variant,
                       run=RunConfig(depth=4, seed=7, dtype=torch.float64), **qk)
        for name in ("mu", "mu_relative"):
            mine = df[df["metric"] == name].sort_values("layer")["mean"].to_numpy()
            assert (mine == ref.metrics[name].mean(dim=1).numpy()).all()  # bit-identical
    other = run_simulate(Unit("simulate", {**params, "seed": 8}, "t"), ctx)
    assert not pd.Series(other["mean"].to_numpy()).equals(pd.Series(got["mean"].to_numpy()))


SPLIT = {"model": "m", "mask": "causal", "variant": "layernorm", "value": "gaussian", "init_scale": 1.0, "d_qk": 1.0,
         "depth": 6, "n_samples": 8, "seed": 7, "dtype": "float64"}  # D = 3, run to 2 D = 6


@pytest.mark.parametrize("chunk", [4, 64])
def test_windows_beyond_depth_check_windows_run_to_the_claim_depth(chunk):
    """K = 4 of 8 windows run to 2 D: layers 0..D hold all 8 windows with the numbers of a
    run of all 8 to 2 D, layers D+1..2 D the first 4 (``n_samples`` 4) with that run's
    numbers of those windows. With ``chunk`` 4 every window is in the batch it has without
    K (bit-identical); with 64 the 8 windows run as two batches of 4 instead of one of 8,
    equal to float64 round-off."""
    params = {**SPLIT, "chunk": chunk}
    full = run_simulate(Unit("simulate", params, "t"), TinyContext(8))
    split = run_simulate(Unit("simulate", {**params, "depth_check_windows": 4}, "t"), TinyContext(8))
    key = lambda df: sorted(zip(df["metric"], df["layer"], df["point"]))  # noqa: E731
    assert key(split) == key(full)
    full = full.set_index(["metric", "layer"])
    for (metric, layer), row in split.set_index(["metric", "layer"]).iterrows():
        ref = full.loc[(metric, layer)]
        want = ref["values"] if layer <= 3 else ref["values"][:4]
        assert row["n_samples"] == len(row["values"]) == (8 if layer <= 3 else 4)
        if chunk == 4:
            assert np.array_equal(row["values"], want, equal_nan=True)
        else:
            np.testing.assert_allclose(row["values"], want, rtol=1e-12, atol=0)
        np.testing.assert_allclose(row["mean"], np.nanmean(want), rtol=1e-12)
    # K >= n: the unit runs as without K
    same = run_simulate(Unit("simulate", {**params, "depth_check_windows": 8}, "t"), TinyContext(8))
    assert same.drop(columns="unit").equals(full.reset_index()[same.columns].drop(columns="unit"))


def test_row_dtype_is_the_compute_dtype_not_the_input_storage():
    """Float32 embeddings enter a float64 trajectory exactly; every layer after is a
    float64 computation, so its rows carry float64 (floor 2.2e-16), not float32."""
    ctx = TinyContext()
    params = {"model": "m", "mask": "complete", "variant": "pure", "value": "gaussian", "init_scale": 1.0, "d_qk": 1.0,
              "depth": 3, "n_samples": 3, "seed": 0, "dtype": "float64", "metrics": ["mu_relative"]}
    ctx.X0 = ctx.X0.float()  # stored as float32, as model embeddings are
    df = run_simulate(Unit("simulate", params, "t"), ctx)
    assert set(df["dtype"]) == {"float64"}
    assert set(run_simulate(Unit("simulate", {**params, "dtype": "float32"}, "t"), ctx)["dtype"]) == {"float32"}
    from rankcollapse.experiments.units import compute_dtype

    assert compute_dtype(Unit("probe", {"model": "m"}, "t")) == "float32"
    assert compute_dtype(Unit("pretrained_sa", {"model": "m"}, "t")) == "float64"
    assert compute_dtype(Unit("theory", {"check": "basin"}, "t")) == "float64"


class FailingProbeContext(RunContext):
    """A loaded model whose probe fails (as SmolLM2 without norms overflows float32)."""

    def __init__(self):
        super().__init__({"corpus": "wikipedia", "n_tokens": 6, "seed": 0})

    def model(self, name):
        from types import SimpleNamespace

        return SimpleNamespace(family="gpt2", model=SimpleNamespace(config=SimpleNamespace(model_type="gpt2")))

    def windows(self, model, n_samples):
        from types import SimpleNamespace

        return SimpleNamespace(n_samples=n_samples)


@pytest.mark.parametrize("drop", [["norm"], []])
def test_a_failed_probe_is_no_rows_with_a_warning_not_a_data_row(monkeypatch, drop):
    from rankcollapse.errors import MetricError
    from rankcollapse.experiments.table import COLUMNS
    probe_module = importlib.import_module("rankcollapse.models.probe")  # the module, not the function

    def failing(*args, **kwargs):
        raise MetricError("X has non-finite values at layer 3")

    monkeypatch.setattr(probe_module, "probe", failing)
    unit = Unit("probe", {"model": "gpt2", "n_samples": 4, "drop": drop}, "fig2")
    if not drop:  # the full model failing is an error of the run
        with pytest.raises(MetricError, match="non-finite"):
            run_probe(unit, FailingProbeContext())
        return
    with pytest.warns(RuntimeWarning, match=r"no rows, the probe failed without norm: X has non-finite"):
        df = run_probe(unit, FailingProbeContext())
    assert len(df) == 0 and list(df.columns[: len(COLUMNS)]) == list(COLUMNS)


def test_probe_condition_labels_control_and_clip():
    """A probe unit's control and clip become its value and variant labels, so a claim
    selects them with the model's own name."""
    from rankcollapse.errors import ConfigError
    from rankcollapse.experiments.units import _probe_condition

    sentinel = object()
    assert _probe_condition({}, sentinel, ()) == ("full", "pretrained", sentinel)
    assert _probe_condition({"clip_massive": True}, sentinel, ("norm",))[:2] == ("drop_norm_clip_massive", "pretrained")
    with pytest.raises(ConfigError, match="unknown probe control"):
        _probe_condition({"control": "shuffled"}, sentinel, ())
