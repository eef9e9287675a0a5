"""The pretrained attention-only network has two routes that must be one network:
``models.attention_only(keep=())`` (the real blocks, MLP/skip/norm hooked away) and
``dynamics.simulate`` on ``dynamics.pretrained.extract_attention_weights`` (attention
rebuilt from the extracted W_Q, W_K, W_V, W_O, biases, RoPE, GQA). In float64 they agree
to 1e-10 on MiniLM and SmolLM2 (measured: ~1e-15)."""

import pytest
import torch

from rankcollapse.data import make_windows, wikipedia_texts
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.pretrained import extract_attention_weights
from rankcollapse.models import attention_only, embed, load_model
from rankcollapse.models.families import native_mask_of

METRICS = ["mu", "mu_relative"]


def _both_routes(name: str, length: int):
    loaded = load_model(name)
    loaded.model.double()
    wins = make_windows(wikipedia_texts(), loaded.tokenizer, n_tokens=length, n_samples=2)
    assert bool(wins.attention_mask.all())  # full windows: both routes see the same tokens
    depth = loaded.model.config.num_hidden_layers
    table = attention_only(loaded, wins, depth=depth, keep=(), metrics=METRICS)
    res = simulate(embed(loaded, wins).double(), mask=native_mask_of(loaded),
                   weights=extract_attention_weights(loaded.model), metrics=METRICS,
                   run=RunConfig(depth=depth, dtype=torch.float64))
    hooked = {m: torch.tensor(table[table.metric == m].sort_values("layer")["mean"].to_numpy()) for m in METRICS}
    rebuilt = {m: res.metrics[m].mean(1) for m in METRICS}
    return hooked, rebuilt


def _assert_same_network(hooked, rebuilt):
    # μ/‖X‖_F to 1e-10 absolute everywhere (also past full collapse, where μ is rounding
    # noise of size ~1e-16 ‖X‖_F), and μ to 1e-10 relative wherever it is not yet noise
    torch.testing.assert_close(hooked["mu_relative"], rebuilt["mu_relative"], rtol=0, atol=1e-10)
    live = rebuilt["mu_relative"] > 1e-8
    assert bool(live[:2].all())
    torch.testing.assert_close(hooked["mu"][live], rebuilt["mu"][live], rtol=1e-10, atol=0)


def test_minilm_hooked_equals_rebuilt_attention_only_network():
    _assert_same_network(*_both_routes("minilm", 32))


@pytest.mark.slow
def test_smollm2_hooked_equals_rebuilt_attention_only_network():
    _assert_same_network(*_both_routes("smollm2", 16))
