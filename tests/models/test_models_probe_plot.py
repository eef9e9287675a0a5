"""probe.png keeps final_norm and the raw last block output apart; the embedding-rank
note explains rank-deficient embeddings of position-free (RoPE) families."""

from __future__ import annotations

import pytest  # noqa: E402
import torch  # noqa: E402

from rankcollapse.models import plot as probe_cli  # noqa: E402
from rankcollapse.data import Windows  # noqa: E402
from rankcollapse.models import Intervention, probe  # noqa: E402
from rankcollapse.models.probe import distinct_token_fraction, embedding_rank_note, layernorm_rank_note  # noqa: E402


def _repeating_windows(n_windows=2, length=12, distinct=4) -> Windows:
    ids = (torch.arange(length) % distinct + 5).repeat(n_windows, 1)
    am = torch.ones(n_windows, length, dtype=torch.long)
    return Windows(ids, am, torch.zeros(n_windows, length, dtype=torch.bool))


def test_layer_rows_separate_final_norm_from_last_block_output(make_tiny, make_windows_tiny):
    loaded = make_tiny("llama")
    table = probe(loaded, make_windows_tiny(), Intervention(d_qk_scale=2.0, drop="mlp"), metrics=["mu"])
    blocks, final = probe_cli._layer_rows(table)
    L = loaded.model.config.num_hidden_layers
    assert sorted(blocks["layer"]) == list(range(L + 1))
    assert set(blocks["point"]) == {"embeddings"} | {f"layer.{k}.output" for k in range(L)}
    assert list(final["point"]) == ["final_norm"] and list(final["layer"]) == [L]
    title = probe_cli._settings_title({"tiny": table})
    assert "d_qk_scale=2" in title and "drop=mlp" in title and "mask=model default" in title


def test_plot_draws_final_norm_as_its_own_labelled_series(tmp_path, make_tiny, make_windows_tiny):
    loaded = make_tiny("llama")
    table = probe(loaded, make_windows_tiny(), Intervention(mask="causal_sliding_window:w=4"))
    saved = {"fig": probe_cli.plot_layers({"tiny": table}, tmp_path / "probe.png")}
    assert (tmp_path / "probe.png").stat().st_size > 0
    ax = saved["fig"].axes[0]
    labels = [ln.get_label() for ln in ax.get_lines()]
    assert labels == ["tiny (block outputs)", "tiny final_norm"]
    star = ax.get_lines()[1]
    assert star.get_marker() == "*" and list(star.get_xdata()) == [3]
    assert "causal_sliding_window:w=4" in saved["fig"]._suptitle.get_text()


def test_bert_has_no_final_norm_series(make_tiny, make_windows_tiny):
    table = probe(make_tiny("bert"), make_windows_tiny(), metrics=["mu"])
    blocks, final = probe_cli._layer_rows(table)
    assert final.empty and len(blocks) == 4


def test_distinct_token_fraction_counts_real_tokens_only(make_windows_tiny):
    w = make_windows_tiny(n_windows=1, length=6, pad_last=2)
    w.input_ids[0] = torch.tensor([7, 7, 8, 9, 7, 7])  # last two are padding
    assert distinct_token_fraction(w, dim=32).tolist() == [3 / 4]
    assert distinct_token_fraction(w, dim=2).tolist() == [3 / 2]  # min(n_real, d) = 2


def test_embedding_note_for_rope_family_with_repeated_tokens(make_tiny):
    loaded = make_tiny("llama")
    wins = _repeating_windows()
    table = probe(loaded, wins, metrics=["rank_fraction", "sigma_min"])
    emb = table[(table["point"] == "embeddings")].set_index("metric")["mean"]
    assert emb["rank_fraction"] == pytest.approx(4 / 12) and emb["sigma_min"] < 1e-6
    note = embedding_rank_note(loaded, wins, table)
    assert note is not None and "RoPE" in note and "repeated tokens" in note and "\n" not in note


def test_no_embedding_note_with_absolute_positions_or_full_rank(make_tiny):
    wins = _repeating_windows()
    gpt2 = make_tiny("gpt2")  # absolute position embeddings: rows differ
    assert embedding_rank_note(gpt2, wins, probe(gpt2, wins, metrics=["rank_fraction"])) is None
    llama = make_tiny("llama")
    distinct = Windows(torch.arange(5, 17).repeat(2, 1), torch.ones(2, 12, dtype=torch.long),
                       torch.zeros(2, 12, dtype=torch.bool))
    assert embedding_rank_note(llama, distinct, probe(llama, distinct, metrics=["rank_fraction"])) is None


def _long_windows(n_windows=2, length=40) -> Windows:
    """N = 40 >= d = 32 distinct tokens per window (vocab 97)."""
    ids = torch.stack([torch.arange(1, length + 1) + 50 * w for w in range(n_windows)]) % 97
    return Windows(ids, torch.ones(n_windows, length, dtype=torch.long),
                   torch.zeros(n_windows, length, dtype=torch.bool))


@pytest.mark.parametrize("family, point", [("bert", "layer.0.output"), ("gpt2", "final_norm")])
def test_layernorm_outputs_of_rank_d_minus_1_get_a_note(make_tiny, family, point):
    """Random-init LayerNorm (bias 0) centres each token: its N >= d outputs have rank
    d - 1 = 31 of d = 32 (rank_fraction 31/32, sigma_min at rounding), not collapse."""
    loaded = make_tiny(family)
    wins = _long_windows()
    table = probe(loaded, wins, metrics=["rank_fraction", "sigma_min"])
    at = table[table["point"] == point].set_index("metric")["mean"]
    assert at["rank_fraction"] == pytest.approx(31 / 32) and at["sigma_min"] < 1e-4
    note = layernorm_rank_note(loaded, wins, table)
    assert note is not None and point in note and "LayerNorm's centring, not collapse" in note and "\n" not in note


def test_no_layernorm_note_without_layernorm_or_with_fewer_tokens_than_d(make_tiny):
    wins = _long_windows()
    llama = make_tiny("llama")  # RMSNorm: no centring
    assert layernorm_rank_note(llama, wins, probe(llama, wins, metrics=["rank_fraction"])) is None
    bert, short = make_tiny("bert"), _repeating_windows()  # N = 12 < d = 32
    assert layernorm_rank_note(bert, short, probe(bert, short, metrics=["rank_fraction"])) is None


def test_no_empty_panel_for_a_metric_held_only_at_points_not_drawn(recwarn):
    """A metric recorded only at a module:PATH point has no line in probe.png: no panel for
    it, no legend warning; asking for it is refused."""
    import pandas as pd

    from rankcollapse.errors import ConfigError

    t = pd.DataFrame({"layer": [0, 1, 1], "point": ["embeddings", "layer.0.output", "module:encoder.layer.0.output"],
                      "metric": ["mu", "mu", "sigma_min"], "mean": [1.0, 0.5, 0.3], "q05": [1.0, 0.5, 0.3],
                      "q95": [1.0, 0.5, 0.3]})
    t.attrs["model"] = "x"
    fig = probe_cli.plot_layers(t)
    assert [ax.get_title() for ax in fig.axes] == ["μ(X)"] and all(ax.lines for ax in fig.axes)
    assert not [w for w in recwarn if "legend" in str(w.message)]
    with pytest.raises(ConfigError, match="no rows at the points the figure draws"):
        probe_cli.plot_layers(t, metrics=["sigma_min"])
