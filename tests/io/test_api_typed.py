"""The Python API refuses an absent device and tensors without dense values with a
:class:`RankCollapseError` subclass naming the problem, never torch's ``AssertionError``,
``RuntimeError`` or ``NotImplementedError`` (issue #27, consistency of what is accepted)."""

import pytest
import torch

from rankcollapse import metrics
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.weights import LayerWeights
from rankcollapse.errors import ConfigError, MaskError, MetricError
from rankcollapse.masks import parse_mask
from rankcollapse.masks.convert import block_mask_to_dense, to_additive, to_block_mask, to_hf_4d

# a CUDA index this machine does not have, with or without a GPU
ABSENT = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"


def _tokens():
    return torch.randn(8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


# ------------------------------------------------------------------ absent device
@pytest.mark.parametrize("spec", ["causal", "sliding_window:w=3", "documents:lengths=3+5"])
def test_to_dense_absent_device_is_config_error(spec):
    with pytest.raises(ConfigError, match="not available"):
        parse_mask(spec, 8).to_dense(device=ABSENT)


def test_mask_conversions_absent_device_are_config_errors():
    m = parse_mask("causal", 8)
    for convert in (lambda: to_block_mask(m, block_size=4, device=ABSENT),
                    lambda: to_additive(m, device=ABSENT),
                    lambda: to_hf_4d(m, device=ABSENT),
                    lambda: block_mask_to_dense(to_block_mask(m, block_size=4), device=ABSENT)):
        with pytest.raises(ConfigError, match=ABSENT):
            convert()


def test_to_dense_bad_device_name_is_config_error():
    with pytest.raises(ConfigError, match="not a torch device"):
        parse_mask("causal", 4).to_dense(device="gpu7")


def test_the_meta_device_is_refused_where_a_device_is_taken(tmp_path):
    """Tensors on the meta device hold no values: nothing can be simulated or measured there."""
    from tests.cli._harness import check_run

    with pytest.raises(ConfigError, match="device 'meta' holds shapes without values"):
        parse_mask("causal", 4).to_dense(device="meta")
    with pytest.raises(ConfigError, match="device 'meta' holds shapes without values"):
        simulate(torch.randn(1, 4, 2, dtype=torch.float64), "causal", run=RunConfig(depth=1, device="meta"))
    code, out, err = check_run(["simulate", "--device", "meta", "--depth", "1", "--n-tokens", "4", "--d-model", "2"],
                               tmp_path)
    assert code == 2 and out == "" and "holds shapes without values" in err and "internal error" not in err


def test_to_dense_valid_device_unchanged():
    dense = parse_mask("causal", 4).to_dense(device="cpu")
    assert torch.equal(dense, torch.ones(4, 4, dtype=torch.bool).tril())


def test_load_model_absent_device_refused_before_loading(tmp_path):
    import transformers as tf

    from rankcollapse.models import load_model

    torch.manual_seed(0)
    config = tf.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                           intermediate_size=64)
    tf.AutoModel.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="not available"):
        load_model(str(tmp_path), device=ABSENT)


# ------------------------------------------------------------------ sparse and meta tensors
pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

LAYOUTS = {
    "sparse_coo": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.to_sparse_csr(),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("fn", [metrics.mu, metrics.mu_relative, metrics.isoscore,
                                lambda X: metrics.compute_metrics(X)])
def test_metrics_refuse_sparse_naming_layout(fn, layout):
    with pytest.raises(MetricError, match=f"layout {layout}"):
        fn(LAYOUTS[layout](_tokens()))


@pytest.mark.parametrize("fn", [metrics.mu, lambda X: metrics.compute_metrics(X)])
def test_metrics_refuse_meta(fn):
    with pytest.raises(MetricError, match="meta device"):
        fn(torch.empty(8, 4, device="meta"))


def test_metric_inputs_beside_x_refuse_sparse_and_meta():
    X = _tokens()
    with pytest.raises(MetricError, match="padding_mask .*sparse_coo"):
        metrics.mu(X, padding_mask=torch.ones(8, dtype=torch.bool).to_sparse())
    with pytest.raises(MetricError, match="attention is a tensor on the meta device"):
        metrics.attention_entropy(torch.full((8, 8), 1 / 8, device="meta"))
    with pytest.raises(MetricError, match="mask .*sparse_coo"):
        metrics.dirichlet_energy(X, mask=torch.ones(8, 8, dtype=torch.bool).to_sparse())


def test_dense_input_still_measured():
    # the same tokens, dense: mu = ||X - 1 mean||_F (closed form, numpy-free)
    X = _tokens()
    expected = torch.linalg.matrix_norm(X - X.mean(0, keepdim=True))
    assert float(metrics.mu(X)) == pytest.approx(float(expected), rel=1e-12)


def test_simulate_refuses_sparse_and_meta_inputs():
    X = _tokens()
    with pytest.raises(ConfigError, match="X0 .*sparse_coo"):
        simulate(X.to_sparse(), mask="causal", run=RunConfig(depth=2))
    with pytest.raises(ConfigError, match="X0 is a tensor on the meta device"):
        simulate(torch.empty(8, 4, device="meta"), mask="causal", run=RunConfig(depth=2))
    with pytest.raises(ConfigError, match="W_V of layer 0 .*sparse_coo"):
        simulate(X, mask="causal", value=torch.eye(4).to_sparse(), run=RunConfig(depth=2))
    with pytest.raises(MaskError, match="mask .*sparse_coo"):
        simulate(X, mask=torch.ones(8, 8, dtype=torch.bool).to_sparse(), run=RunConfig(depth=2))
    with pytest.raises(MaskError, match="mask is a tensor on the meta device"):
        simulate(X, mask=torch.ones(8, 8, dtype=torch.bool, device="meta"), run=RunConfig(depth=2))
    given = [LayerWeights(W_Q=torch.eye(4).to_sparse(), W_K=torch.eye(4), W_V=torch.eye(4))]
    with pytest.raises(ConfigError, match="layer 0 W_Q .*sparse_coo"):
        simulate(X, mask="causal", weights=given, run=RunConfig(depth=1))


def test_resolved_mask_and_attention_system_absent_device_are_config_errors():
    from rankcollapse.masks import resolve_mask
    from rankcollapse.theory.system import AttentionSystem

    with pytest.raises(ConfigError, match="not available"):
        resolve_mask("causal", 4).to_dense(ABSENT)
    eye = torch.eye(2, dtype=torch.float64)
    system = AttentionSystem(torch.ones(2, 2, dtype=torch.bool), eye, eye, eye)
    with pytest.raises(ConfigError, match="not available"):
        system.to(device=ABSENT)


def test_attention_system_refuses_sparse_and_meta():
    from rankcollapse.theory.system import AttentionSystem

    eye = torch.eye(2, dtype=torch.float64)
    with pytest.raises(MaskError, match="mask .*sparse_coo"):
        AttentionSystem(torch.ones(2, 2, dtype=torch.bool).to_sparse(), eye, eye, eye)
    with pytest.raises(ConfigError, match="W_V is a tensor on the meta device"):
        AttentionSystem(torch.ones(2, 2, dtype=torch.bool), eye, eye, torch.empty(2, 2, device="meta"))


def test_pretrained_value_wider_than_the_model_is_refused():
    # regression guard (the refusal exists on the base branch, untested until now):
    # all-MiniLM-L6-v2's W_V is 384 wide, so d_model=512 has no (d, d) block to take
    from rankcollapse.phase.cell import build_weights
    from rankcollapse.phase.grid import expand_grid

    cell = expand_grid({"value": ["pretrained"]}, {"d_model": 512, "depth": 2, "n_tokens": 4})[0]
    with pytest.raises(ConfigError, match=r"'pretrained' has W_V of shape \(384, 384\); \(512, 512\) is larger"):
        build_weights(cell, 0)
