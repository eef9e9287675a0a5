"""Temperature against sequence length: the ``beta`` axis (a number or a temperature law
such as ``log:γ``), the
windowed (long-sequence) path of the phase sweep, its memory estimate, and the
almost-simplex input."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from rankcollapse.dynamics.inputs import make_tokens
from rankcollapse.dynamics.runner import _plan
from rankcollapse.dynamics.sparse import blocked_attention, merge_row_statistics
from rankcollapse.dynamics.weights import draw, generator
from rankcollapse.errors import ConfigError
from rankcollapse.masks import parse_mask
from rankcollapse.metrics.attention import row_entropy
from rankcollapse.phase import expand_grid, run_phase
from rankcollapse.phase.batched import DENSE_MAX_TOKENS, attention_backend, run_group
from rankcollapse.phase.cell import build_weights, run_cell
from rankcollapse.phase.grid import DEFAULTS, cell_beta, cell_bytes, check_cells, parse_axis


def cell(**over):
    return {**DEFAULTS, **over}


def beta_cell(beta, **over):
    """A cell whose scores are ``β <x_i, x_j>``: ``beta`` set, ``qk_scale`` None (as expand_grid makes it)."""
    return cell(qk_scale=None, beta=beta, **over)


# ------------------------------------------------------------------ beta=log:γ
def test_beta_parses_to_its_canonical_string():
    assert parse_axis("beta=log:1.5,0.5,log:2")[1] == ["log:1.5", 0.5, "log:2.0"]
    assert parse_axis("beta=pow:1,ssmax:0.5,llama4")[1] == ["pow:1.0", "ssmax:0.5", "llama4"]
    assert cell_beta(beta_cell("log:1.5", n_tokens=100)) == 1.5 * math.log(100)
    assert cell_beta(beta_cell(0.5)) == 0.5 and cell_beta(cell()) is None


@pytest.mark.parametrize("text", ["log:-1", "log:abc", "log:", "log:inf", "lg:1", "pow:", "ssmax:-2", "llama4:1", "-1"])
def test_bad_beta_is_refused(text):
    with pytest.raises(ConfigError):
        parse_axis(f"beta={text}")


@pytest.mark.parametrize("text", ["log:1", "pow:1", "llama4"])
def test_qk_scale_takes_numbers_only(text):
    with pytest.raises(ConfigError, match="qk_scale"):
        parse_axis(f"qk_scale={text}")


def test_beta_with_a_non_default_qk_scale_is_refused():
    with pytest.raises(ConfigError, match="give one temperature"):
        expand_grid({"beta": ["log:1"], "qk_scale": [1.0, 2.0]}, {"n_tokens": 8, "d_model": 4, "depth": 2})
    (c,) = expand_grid({"beta": ["log:1"]}, {"n_tokens": 8, "d_model": 4, "depth": 2})
    assert c["qk_scale"] is None and c["beta"] == "log:1"
    for both_or_neither in (cell(beta="log:1.0"), cell(qk_scale=None)):
        with pytest.raises(ConfigError, match="give one temperature"):
            check_cells([both_or_neither])


def test_log_beta_gives_scores_beta_times_inner_products():
    """Scores q k^T * scale = γ log N <x_i, x_j> (Chen et al., ICLR 2026) in float64: unit
    tokens, so the two sums of d products differ by at most ~2 d eps β (Higham's dot-product bound)."""
    N, d, gamma = 100, 6, 1.5
    (lw,) = build_weights(beta_cell("log:1.5", n_tokens=N, d_model=d, depth=1), seed=3)
    X = make_tokens("sphere", 1, N, d, seed=1)[0]
    got = (X @ lw.W_Q) @ (X @ lw.W_K).T * lw.scale
    want = gamma * math.log(N) * (X @ X.T)
    beta = gamma * math.log(N)
    assert torch.allclose(got, want, rtol=0, atol=4 * d * torch.finfo(torch.float64).eps * beta)
    assert not torch.allclose(got, 1.01 * want, rtol=0, atol=4 * d * torch.finfo(torch.float64).eps * beta)
    assert torch.equal(lw.W_K, torch.eye(d, dtype=torch.float64))


@pytest.mark.parametrize("law, beta", [("pow:0.5", lambda N, d: 0.5 * N ** (2 / (d - 1))),
                                       ("ssmax:2", lambda N, d: 2 * math.log(N) / math.sqrt(d)),
                                       ("llama4", lambda N, d: 1 / math.sqrt(d)),
                                       (2.5, lambda N, d: 2.5)])
def test_other_laws_and_a_number_give_scores_beta_times_inner_products(law, beta):
    N, d = 50, 5
    (lw,) = build_weights(beta_cell(law, n_tokens=N, d_model=d, depth=1), seed=0)
    X = make_tokens("sphere", 1, N, d, seed=1)[0]
    got = (X @ lw.W_Q) @ (X @ lw.W_K).T * lw.scale
    b = beta(N, d)
    assert torch.allclose(got, b * (X @ X.T), rtol=0, atol=4 * d * torch.finfo(torch.float64).eps * b)


def test_llama4_cell_with_position_dependent_beta_is_refused():
    check_cells([beta_cell("llama4", n_tokens=8191)])
    with pytest.raises(ConfigError, match="position"):
        check_cells([beta_cell("llama4", n_tokens=8192)])


def test_plain_qk_scale_draws_are_unchanged():
    """A number s keeps W_Q, W_K ~ N(0, s^2/d) from the stream (seed, 0, role), bit for bit."""
    d = 5
    layers = build_weights(cell(qk_scale=0.5, d_model=d, depth=3), seed=2)
    for role in ("W_Q", "W_K"):
        ref = draw("gaussian", d, d, generator(2, 0, role), n=3, role=role, std=0.5 / math.sqrt(d))
        assert all(torch.equal(getattr(lw, role), ref[t]) for t, lw in enumerate(layers))


def test_beta_refuses_a_narrow_key_width():
    with pytest.raises(ConfigError, match="d_qk"):
        check_cells([beta_cell("log:1.0", d_qk=4, d_model=8)])


def test_log_beta_orders_collapse_by_gamma():
    """Positive and negative control at N = 256 on the almost-simplex start (ρ = 1/2, so the
    paper's γ_c = 2): γ = 0.5 averages every token towards the mean (μ/||X||_F falls to a
    few percent of its start), γ = 6 leaves the attention nearly the identity."""
    cells = expand_grid({"beta": ["log:0.5", "log:6"]},
                        {"n_tokens": 256, "d_model": 64, "depth": 1, "norm": "sphere", "input": "simplex",
                         "value": "orthogonal"})
    low, high = run_group(cells, n_samples=2)
    m0 = math.sqrt(0.5)  # mu/||X||_F of the start: every token is sqrt(1/2) from the mean direction
    assert low["mu_relative"] < 0.1 * m0
    assert high["mu_relative"] > 0.95 * m0
    assert high["attention_entropy"] < low["attention_entropy"]


def test_mixed_plain_and_law_betas_write_one_string_column(tmp_path):
    fixed = {"n_tokens": 8, "d_model": 4, "depth": 2}
    cells = expand_grid({"beta": [1.0, "log:1.0"]}, fixed) + expand_grid({"qk_scale": [0.5]}, fixed)
    table, _ = run_phase(cells, n_samples=1, cache_dir=tmp_path / "cache")
    assert list(table["beta"]) == ["1.0", "log:1.0", None]
    assert table["qk_scale"].isna().tolist() == [True, True, False] and table["qk_scale"].iloc[2] == 0.5
    table.to_parquet(tmp_path / "t.parquet")
    back = pd.read_parquet(tmp_path / "t.parquet")
    assert list(back["beta"][:2]) == ["1.0", "log:1.0"] and back["beta"].isna().iloc[2]
    assert back["qk_scale"].iloc[2] == 0.5
    from rankcollapse.phase.findings import summarize

    out = summarize(table)  # each temperature summarised under its own name
    assert list(out["by_qk_scale"]) == [0.5] and sorted(out["by_beta"]) == ["1.0", "log:1.0"]


# ------------------------------------------------------------------ the long-sequence path
def test_n_tokens_axis_reaches_two_to_the_sixteen():
    assert parse_axis("n_tokens=65536")[1] == [65536]
    with pytest.raises(ConfigError):
        parse_axis("n_tokens=65537")
    assert attention_backend(DENSE_MAX_TOKENS) == "dense" and attention_backend(DENSE_MAX_TOKENS + 1) == "blocked"
    with pytest.raises(ConfigError):
        attention_backend(64, "flex")


@pytest.mark.parametrize("over", [
    dict(norm="sphere", input="simplex", value="orthogonal", qk_scale=None, beta="log:1.5"),
    dict(norm="layernorm", placement="post_ln", alpha=1.0, value="near_identity"),
    dict(norm="rmsnorm", placement="pre_ln", alpha=1.0, mask="sliding_window:w=9", qk_scale=2.0),
    dict(norm="none", mask="bigbird:w=3,globals=2,random=2", value="orthogonal", shared=True),
    # every placement: both paths take the update from dynamics.layers.placement_update
    dict(norm="rmsnorm", placement="peri", alpha=1.0),
    dict(norm="layernorm", placement="mix", alpha=1.0, mask="causal"),
    dict(norm="sphere", placement="lns", alpha=1.0),
    dict(norm="sphere", placement="ngpt", alpha=1.0),
    dict(norm="dyt", placement="pre_ln", alpha=1.0),
])
def test_blocked_path_matches_the_dense_path(over):
    """The windowed path and the dense path on the same cells, float64, N = 300 (not a
    multiple of the block size: padded rows; BigBird: global rows on the dense slab).
    States differ by a few roundings per layer; μ/||X||_F, entropy and ε inherit that."""
    cells = [cell(n_tokens=300, d_model=8, depth=6, **over)]
    dense = run_group(cells, n_samples=2, backend="dense")
    blocked = run_group(cells, n_samples=2, backend="blocked")
    for a, b in zip(dense, blocked):
        assert a["regime"] == b["regime"] and a["k"] == b["k"] and a["law"] == b["law"]
        assert b["mu_relative"] == pytest.approx(a["mu_relative"], rel=1e-9, abs=1e-13)
        for key in ("attention_entropy", "entropy_last", "stable_rank"):
            assert b[key] == pytest.approx(a[key], rel=1e-10, abs=1e-12), key
        assert b["epsilon_measured"] == pytest.approx(a["epsilon_measured"], rel=1e-9)
        assert abs(b["row_mass_deficit"]) < 1e-14 and abs(a["row_mass_deficit"]) < 1e-14  # softmax rows: round-off


@pytest.mark.parametrize("spec", ["complete", "sliding_window:w=5", "bigbird:w=3,globals=1,random=2"])
def test_row_statistics_match_the_dense_reference(spec):
    """ε, row entropy (metrics.attention.row_entropy, the registry's) and row-mass deficit of
    the windowed kernel's chunks against the dense (N, N) weights, float64."""
    N, d = 150, 4
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(2, 1, N, d, generator=gen, dtype=torch.float64) * 2 for _ in range(3))
    mask = parse_mask(spec, N)
    allowed = mask.to_dense()
    parts: dict = {}
    out, _ = blocked_attention(Q, K, V, _plan(mask, 32, torch.device("cpu")), scale=0.7, row_stats=parts)
    stats = merge_row_statistics(parts)
    s = (Q @ K.transpose(-1, -2) * 0.7).masked_fill(~allowed, float("-inf"))
    A = torch.softmax(s, -1)
    assert torch.allclose(out, A @ V, rtol=1e-12, atol=1e-13)
    assert torch.allclose(stats["entropy"], row_entropy(A, allowed).unsqueeze(-1), rtol=0, atol=1e-13)
    assert torch.allclose(stats["epsilon"], A.masked_fill(~allowed, 1.0).amin(dim=(-1, -2)), rtol=1e-12, atol=0)
    assert stats["row_mass_deficit"].abs().max() < 1e-15


def test_memory_estimate_follows_the_chunked_path():
    """N = 65,536 at d = 64: the dense estimate (2 depth samples N^2 floats of attention) is
    refused, the windowed one is states + a chunk per thread, O(chunk N)."""
    c = beta_cell("log:2.0", n_tokens=65536, d_model=64, depth=2)
    threads = torch.get_num_threads()
    chunk = 3 * 64 * 65536 + 2 * 65536 * 64
    assert cell_bytes(c, 1) == 8 * (2 * 2 * 3 * 64 * 64 + 8 * 65536 * 64 + threads * chunk)
    assert cell_bytes(c, 1) < 2 * 2 * 65536**2  # far below one dense (N, N) float64 array
    check_cells([c], 1)
    with pytest.raises(ConfigError, match="run_phase"):
        run_cell(c, n_samples=1)


# ------------------------------------------------------------------ the almost-simplex input
def test_simplex_tokens_have_pairwise_cosine_rho():
    X = make_tokens("simplex", 2, 400, 256, seed=0)
    assert torch.allclose(X.norm(dim=-1), torch.ones(2, 400, dtype=torch.float64), atol=1e-15)
    assert torch.all(X[..., 0] == math.sqrt(0.5))
    G = X @ X.transpose(-1, -2)
    off = G[:, ~torch.eye(400, dtype=torch.bool)]
    # <u_i, u_j> on S^254 has mean 0 and sd 1/sqrt(255): the mean over 2 x 159,600 pairs is 0.5 +- ~1e-4
    assert float(off.mean()) == pytest.approx(0.5, abs=2e-3)
    assert float(off.std()) == pytest.approx(0.5 / math.sqrt(255), rel=0.05)
    with pytest.raises(ConfigError):
        make_tokens("simplex", 1, 4, 1)
    assert np.isfinite(X.numpy()).all()


# ------------------------------------------------------------------ what the windowed kernel refuses
@pytest.mark.parametrize("over, named", [({"qk_norm": True}, "qk_norm=on"), ({"attention": "sigmoid"}, "attention=sigmoid"),
                                         ({"attention": "diff:lambda=0.5", "qk_norm": True}, "qk_norm=on, attention=diff")])
def test_grid_check_refuses_long_cells_the_windowed_kernel_cannot_run(over, named):
    with pytest.raises(ConfigError, match=rf"n_tokens={DENSE_MAX_TOKENS + 1} with {named}.*above {DENSE_MAX_TOKENS} tokens"):
        check_cells([cell(n_tokens=DENSE_MAX_TOKENS + 1, **over)])
    check_cells([cell(n_tokens=DENSE_MAX_TOKENS, **over)])  # the dense path takes them
    check_cells([cell(n_tokens=DENSE_MAX_TOKENS + 1)])  # softmax without qk_norm runs windowed
