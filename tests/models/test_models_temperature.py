"""d_qk= on a pretrained model: its own d_qk is 1/scaling², and d_qk=D is d_qk_scale=D·scaling²."""

import math

import pytest

from rankcollapse.errors import ConfigError, ModelError
from rankcollapse.models import Intervention, d_qk_scale_for, model_d_qk, probe


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama", "t5"])
def test_model_d_qk_is_one_over_scaling_squared(kind, make_tiny):
    loaded = make_tiny(kind)
    attn = next(m for m in loaded.model.modules() if isinstance(getattr(m, "scaling", None), float))
    assert model_d_qk(loaded) == pytest.approx(1.0 / attn.scaling ** 2, rel=1e-12)
    if kind == "t5":  # T5 does not scale its logits
        assert model_d_qk(loaded) == 1.0


def test_d_qk_gives_the_same_probe_as_the_matching_d_qk_scale(make_tiny, make_windows_tiny):
    loaded, w = make_tiny("bert"), make_windows_tiny()
    own = model_d_qk(loaded)
    by_scale = probe(loaded, w, Intervention(d_qk_scale=4.0))
    by_d_qk = probe(loaded, w, Intervention(d_qk=4.0 * own))
    assert by_d_qk.attrs["d_qk"] == 4.0 * own
    assert by_d_qk.attrs["d_qk_scale"] == pytest.approx(4.0, rel=1e-12)
    assert by_d_qk["mean"].to_numpy() == pytest.approx(by_scale["mean"].to_numpy(), rel=1e-5, nan_ok=True)
    unchanged = probe(loaded, w)
    assert probe(loaded, w, Intervention(d_qk=own))["mean"].to_numpy() == pytest.approx(unchanged["mean"].to_numpy(), rel=1e-6,
                                                                           nan_ok=True)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "4"])
def test_bad_d_qk_is_a_config_error(bad, make_tiny):
    with pytest.raises(ConfigError, match="d_qk must be a positive finite number"):
        d_qk_scale_for(make_tiny("bert"), bad)


def test_d_qk_and_d_qk_scale_together_is_a_config_error(make_tiny):
    with pytest.raises(ConfigError, match="not both"):
        d_qk_scale_for(make_tiny("bert"), 8.0, 2.0)


def test_generic_layout_without_a_known_scaling_has_no_d_qk(make_tiny):
    import dataclasses

    generic = dataclasses.replace(make_tiny("bert"), family="generic")  # BertAttention holds no scaling
    with pytest.raises(ModelError, match="BertAttention has no numeric 'scaling'"):
        model_d_qk(generic)
    assert model_d_qk(make_tiny("distilbert")) == pytest.approx(8.0)  # generic layout, d_head 8
