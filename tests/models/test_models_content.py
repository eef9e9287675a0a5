"""X(0) without position embeddings (``models.content``) and the long windows of the
temperature claims' sequence-length axis (fig3.yaml ``n_tokens_axis``): shape and
determinism at N = 8,192, equality with the model's own forward whose position table is
zeroed (an independent reference: transformers' ``BertEmbeddings.forward``), and
equality of the new run-context path with the old one at N = 128."""

import copy

import pytest
import torch

from rankcollapse.data import Windows, make_windows
from rankcollapse.errors import ConfigError, ModelError
from rankcollapse.models.content import content_embeddings
from rankcollapse.models.probe import embed
from rankcollapse.sweep.context import RunContext

DATA = {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}


@pytest.fixture(scope="module")
def ctx():
    return RunContext(DATA)


def _zeroed_positions(loaded):
    """A copy of ``loaded`` whose position table is all zeros (its forward then adds 0)."""
    other = copy.deepcopy(loaded)
    base = getattr(other.model, other.model.base_model_prefix, other.model)
    table = base.embeddings.position_embeddings if hasattr(base, "embeddings") else base.wpe
    with torch.no_grad():
        table.weight.zero_()
    return other


@pytest.mark.parametrize("kind", ["bert", "roberta", "albert", "gpt2"])
def test_equals_the_forward_with_a_zeroed_position_table(kind, make_tiny, make_windows_tiny):
    loaded = make_tiny(kind)
    win = make_windows_tiny(n_windows=3, length=10, pad_last=0)
    got = content_embeddings(loaded, win, batch_size=2)
    want = embed(_zeroed_positions(loaded), win)
    assert got.shape == (3, 10, want.shape[-1]) and got.dtype == torch.float32
    # equal up to float32 round-off: ALBERT's embedding projection is a matmul whose blocking
    # (batch of 2 here, 3 there; the thread count) may change the last bit
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and it is not the model's embedding output (the positions are there)
    assert not torch.allclose(got, embed(loaded, win))


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_families_without_a_position_table_are_refused(kind, make_tiny, make_windows_tiny):
    with pytest.raises(ModelError, match="without position embeddings"):
        content_embeddings(make_tiny(kind), make_windows_tiny())


def test_longer_than_the_position_table(make_tiny):
    loaded = make_tiny("bert")  # 512 positions
    ids = torch.randint(1, 97, (2, 600), generator=torch.Generator().manual_seed(3))
    win = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    with pytest.raises(ConfigError, match="exceed"):
        embed(loaded, win)
    X = embed(loaded, win, positions=False)
    assert X.shape == (2, 600, 32)
    # no position term: a token's row depends on its id only
    same = ids[0] == ids[0, 0]
    assert torch.equal(X[0, same], X[0, :1].expand(int(same.sum()), -1))


def test_minilm_at_n_128_equals_the_zeroed_forward_and_the_old_path(ctx):
    loaded = ctx.model("minilm")
    old = ctx.embeddings("minilm", 4)  # the path every existing unit takes
    assert torch.equal(ctx.embeddings("minilm", 4, n_tokens=128, positions=True), old)
    assert torch.equal(ctx.windows("minilm", 4, n_tokens=128).input_ids, ctx.windows("minilm", 4).input_ids)
    win = make_windows(ctx.texts(), loaded.require_tokenizer(), n_tokens=128, n_samples=4, seed=0)
    assert torch.equal(embed(loaded, win), old)
    none = ctx.embeddings("minilm", 4, n_tokens=128, positions=False)
    assert torch.equal(none, embed(_zeroed_positions(loaded), win))
    assert none.shape == old.shape and not torch.allclose(none, old)


def test_minilm_long_windows_shape_and_determinism(ctx):
    X = ctx.embeddings("minilm", 2, n_tokens=8192, positions=False)
    assert X.shape == (2, 8192, 384) and X.dtype == torch.float32 and torch.isfinite(X).all()
    # a fresh context (another process) cuts and embeds the same windows
    again = RunContext(DATA).embeddings("minilm", 2, n_tokens=8192, positions=False)
    assert torch.equal(X, again)
    # the same token stream at every N: the first 1,022 body tokens of the N = 8,192 window
    # are those of the first N = 1,024 window
    short = ctx.windows("minilm", 1, n_tokens=1024).input_ids[0, 1:-1]
    assert torch.equal(ctx.windows("minilm", 2, n_tokens=8192).input_ids[0, 1:1023], short)
    with pytest.raises(ConfigError, match="512 positions"):
        ctx.embeddings("minilm", 2, n_tokens=1024)

