"""The FlexAttention backend and the simulate CLI's --backend option."""

import json

import pytest
import torch

from rankcollapse.dynamics import BlockConfig, RunConfig, simulate
from rankcollapse.errors import ConfigError
from tests.cli._harness import run_cli


@pytest.mark.slow  # torch.compile: ~10 s
def test_flex_equals_dense_and_blocked():
    X = torch.randn(2, 200, 16, generator=torch.Generator().manual_seed(0))
    kw = dict(mask="longformer:w=9,globals=0+100", block=BlockConfig(n_heads=2), metrics=("mu",))
    dense = simulate(X, run=RunConfig(depth=3, backend="dense", record_states=True), **kw)
    flex = simulate(X, run=RunConfig(depth=3, backend="flex", record_states=True), **kw)
    assert flex.config["backend"] == "flex"
    for a, b in zip(dense.states, flex.states):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_flex_refuses_what_it_cannot_record():
    X = torch.randn(1, 32, 8)
    with pytest.raises(ConfigError, match="record_epsilon"):
        simulate(X, mask="causal", run=RunConfig(depth=1, backend="flex", record_epsilon=True))
    with pytest.raises(ConfigError, match="backend must be one of"):
        simulate(X, mask="causal", run=RunConfig(depth=1, backend="sparse"))


@pytest.mark.slow  # torch.compile
def test_flex_overflowing_layer_goes_to_the_windowed_kernel():
    X = torch.randn(1, 64, 4, generator=torch.Generator().manual_seed(1)) * 1e18  # q.k bound past float32
    kw = dict(mask="causal_sliding_window:w=8", metrics=("mu",), query_key="gaussian:std=1")
    dense = simulate(X, run=RunConfig(depth=1, backend="dense", record_states=True), **kw)
    flex = simulate(X, run=RunConfig(depth=1, backend="flex", record_states=True), **kw)
    torch.testing.assert_close(flex.states[-1], dense.states[-1])


def test_cli_backend_option():
    args = ["--mask", "causal_sliding_window:w=4", "--n-tokens", "40", "--depth", "2", "--n-samples", "1", "--d-model", "8",
            "--format", "json"]
    runs = {b: run_cli("simulate", *args, "--backend", b) for b in ("dense", "blocked", "nope")}
    docs = {b: json.loads(p.stdout) for b, p in runs.items() if b != "nope"}
    assert docs["blocked"]["settings"]["backend"] == "blocked"
    for a, b in zip(docs["dense"]["layers"], docs["blocked"]["layers"]):
        assert a["mu"] == pytest.approx(b["mu"], rel=1e-5) and (a["epsilon_measured"] is None) == (b["epsilon_measured"] is None)
    assert runs["nope"].returncode == 2 and "--backend must be one of" in runs["nope"].stderr
