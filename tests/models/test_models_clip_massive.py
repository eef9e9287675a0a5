"""``clip_massive``: the massive token's row is scaled to the median norm at the first
block where it appears; a model without one is left bit for bit; it composes with
``drop`` and ``mask`` and ignores padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from family_configs import build, ids

from rankcollapse.errors import ConfigError
from rankcollapse.models import Recorder, as_loaded, intervene
from rankcollapse.models.massive import MASSIVE_RATIO

POINTS = ["layer.0.output", "layer.1.output", "layer.2.output"]


def _inflate(model, block=1, row=0, factor=1000.0):
    """A hook making ``row`` of ``block``'s output massive (registered before the clip)."""
    def hook(module, args, output):
        X = (output[0] if isinstance(output, tuple) else output).clone()
        X[:, row] *= factor
        return (X,) + output[1:] if isinstance(output, tuple) else X

    return model.layers[block].register_forward_hook(hook)


def _run(loaded, x, am, **kw):
    with torch.no_grad(), intervene(loaded, attention_mask=am, **kw), Recorder(loaded, POINTS) as rec:
        loaded.model(input_ids=x, attention_mask=am)
    return rec.outputs


def test_no_massive_token_leaves_the_model_bit_for_bit():
    loaded = as_loaded(build("llama"))
    x, am = ids(2, 9), torch.ones(2, 9, dtype=torch.long)
    plain, clipped = _run(loaded, x, am), _run(loaded, x, am, clip_massive=True)
    for p in POINTS:
        norms = plain[p].double().norm(dim=-1)
        assert float((norms.max(-1).values / norms.median(-1).values).max()) < MASSIVE_RATIO  # premise
        assert torch.equal(plain[p], clipped[p]), p


def test_massive_row_scaled_to_the_median_at_its_first_block():
    loaded = as_loaded(build("llama"))
    x, am = ids(2, 9), torch.ones(2, 9, dtype=torch.long)
    handle = _inflate(loaded.model)
    try:
        inflated = _run(loaded, x, am)
        clipped = _run(loaded, x, am, clip_massive=True)
    finally:
        handle.remove()
    assert torch.equal(inflated["layer.0.output"], clipped["layer.0.output"])  # before the massive block
    X = inflated["layer.1.output"].double()
    norms = X.norm(dim=-1).numpy()
    want = X.clone()
    for b in range(2):
        want[b, 0] *= np.median(norms[b]) / norms[b, 0]
    torch.testing.assert_close(clipped["layer.1.output"].double(), want, rtol=1e-6, atol=1e-6)
    got = clipped["layer.1.output"].double().norm(dim=-1)
    np.testing.assert_allclose(got[:, 0].numpy(), np.median(norms, axis=1), rtol=1e-6)
    assert not torch.equal(inflated["layer.2.output"], clipped["layer.2.output"])  # the model ran on from it


def test_composes_with_drop_and_ignores_padding():
    loaded = as_loaded(build("llama"))
    x = ids(2, 9)
    am = torch.ones(2, 9, dtype=torch.long)
    am[1, 0] = 0  # window 1: the inflated position 0 is padding, not a real token
    handle = _inflate(loaded.model)
    try:
        dropped = _run(loaded, x, am, drop="mlp:2")
        both = _run(loaded, x, am, drop="mlp:2", clip_massive=True)
    finally:
        handle.remove()
    n0 = both["layer.1.output"].double().norm(dim=-1)
    real = n0[0].numpy()
    assert float(n0[0, 0]) == pytest.approx(float(np.median(real)), rel=1e-6)  # window 0 clipped
    assert torch.equal(both["layer.1.output"][1], dropped["layer.1.output"][1])  # window 1: padding ignored
    with pytest.raises(ConfigError, match="needs the batch's attention_mask"):
        with intervene(loaded, clip_massive=True):
            pass


def _probe_clipped(loaded, x, am, rows_by_block):
    """probe with clip_massive while hand hooks inflate ``{block: {row: factor}}``."""
    from rankcollapse.data import Windows
    from rankcollapse.models import Intervention, probe

    handles = []
    for block, rows in rows_by_block.items():
        for row, factor in rows.items():
            handles.append(_inflate(loaded.model, block, row, factor))
    try:
        w = Windows(x, am, torch.zeros_like(x, dtype=torch.bool))
        plain = _run(loaded, x, am)
        df = probe(loaded, w, Intervention(clip_massive=True), metrics=["max_norm_ratio"], progress=False, batch_size=1)
        clipped = _run(loaded, x, am, clip_massive=True)
    finally:
        for h in handles:
            h.remove()
    return plain, clipped, df


def _ratio(X):
    n = X.double().norm(dim=-1).numpy()
    return n.max(-1) / np.median(n, axis=-1), n.argmax(-1)


def test_clip_report_names_block_token_and_ratios_by_hand():
    from rankcollapse.models.massive import clip_report

    loaded = as_loaded(build("llama"))
    x, am = ids(2, 9), torch.ones(2, 9, dtype=torch.long)
    plain, clipped, df = _probe_clipped(loaded, x, am, {1: {0: 1000.0, 4: 300.0}})  # two massive tokens
    before, _ = _ratio(plain["layer.1.output"])
    after, where_after = _ratio(clipped["layer.1.output"])
    assert after.min() >= MASSIVE_RATIO and list(where_after) == [4, 4]  # premise: the second token remains
    recs = df.attrs["massive_clips"]
    assert [(r["window"], r["point"], r["block"], r["token"]) for r in recs] == [(0, "layer.1.output", 1, 0),
                                                                               (1, "layer.1.output", 1, 0)]
    np.testing.assert_allclose([r["ratio"] for r in recs], before, rtol=1e-6)
    np.testing.assert_allclose([r["ratio_after"] for r in recs], after, rtol=1e-6)
    later, _ = _ratio(clipped["layer.2.output"])
    assert all((r["returns_at"] == 2) == (later[i] >= MASSIVE_RATIO) for i, r in enumerate(recs))
    line = clip_report(recs, 2)
    assert "clipped 2 of 2 windows at layer.1.output (2), token 0 (2)" in line
    assert "(a second massive token)" in line


def test_clip_report_tells_a_rebuilt_token_from_another():
    from rankcollapse.models.massive import clip_report

    loaded = as_loaded(build("llama"))
    x, am = ids(2, 9), torch.ones(2, 9, dtype=torch.long)
    _, clipped, df = _probe_clipped(loaded, x, am, {0: {2: 1000.0}, 2: {2: 1000.0}})  # token 2 rebuilt at block 2
    recs = df.attrs["massive_clips"]
    assert [(r["block"], r["token"], r["returns_at"], r["returns_token"], r["returns_point"]) for r in recs] == \
        [(0, 2, 2, 2, "layer.2.output")] * 2
    assert "massive again in 2 windows, first at layer.2.output (2): the same token rebuilt in 2, another token in 0" \
        in clip_report(recs, 2)
    _, _, df = _probe_clipped(loaded, x, am, {0: {2: 1000.0}, 2: {6: 1000.0}})  # another token at block 2
    assert [(r["returns_at"], r["returns_token"]) for r in df.attrs["massive_clips"]] == [(2, 6)] * 2
    assert "another token in 2" in clip_report(df.attrs["massive_clips"], 2)
    assert "nothing clipped" in clip_report([], 2)


def test_clip_on_a_generic_layout_family():
    loaded = as_loaded(build("gpt_neox"))  # generic layout: blocks only
    assert loaded.family == "generic"
    x, am = ids(2, 9), torch.ones(2, 9, dtype=torch.long)
    inflated_then_clipped = _probe_clipped(loaded, x, am, {1: {3: 1000.0}})[2].attrs["massive_clips"]
    assert [(r["window"], r["block"], r["token"]) for r in inflated_then_clipped] == [(0, 1, 3), (1, 1, 3)]


def test_attention_maps_run_under_the_clip():
    """``attention_maps(clip_massive=True)`` (and so ``probe --attentions --clip-massive``)
    gives the maps of the clipped model: block 2's maps equal those of a forward pass whose
    massive row (block 0's output) a hook written here scales to the median norm. Block 1's
    maps cannot tell (its norm sees the row's direction only); block 2 sees what block 1 added."""
    from rankcollapse.data import Windows
    from rankcollapse.models import Intervention, attention_maps

    loaded = as_loaded(build("llama", attn_implementation="eager"))
    x = ids(2, 9)
    w = Windows(x, torch.ones_like(x), torch.zeros_like(x, dtype=torch.bool))

    def clip_by_hand(module, args, output):
        X = (output[0] if isinstance(output, tuple) else output).clone()
        norms = X.double().norm(dim=-1)  # (B, N)
        X[:, 0] *= (norms.median(dim=-1).values / norms[:, 0]).to(X.dtype)[:, None]  # N = 9: the middle norm
        return (X,) + output[1:] if isinstance(output, tuple) else X

    handle = _inflate(loaded.model, block=0)
    try:
        inflated = attention_maps(loaded, w)
        clipped = attention_maps(loaded, w, Intervention(clip_massive=True))
        hand = loaded.model.layers[0].register_forward_hook(clip_by_hand)
        try:
            want = attention_maps(loaded, w)
        finally:
            hand.remove()
    finally:
        handle.remove()
    torch.testing.assert_close(clipped["layer.2.attention"], want["layer.2.attention"], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(clipped["layer.2.attention"], inflated["layer.2.attention"], rtol=1e-3, atol=1e-4)
    assert torch.equal(clipped["layer.0.attention"], inflated["layer.0.attention"])  # before the clip
