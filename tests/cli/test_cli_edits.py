"""``probe --ablate-heads/--ablation`` and ``--patch-from/--patch-point/--patch-head``:
the same numbers as the API on a tiny GPT-2 folder; options that cannot apply are one
line and exit 2. ``--clip-massive`` says what it clipped."""

import json

import numpy as np
import pytest
import torch
import transformers as tf

from rankcollapse.data import Windows
from rankcollapse.models import HeadAblation, Intervention, patch, probe

from ._harness import check_run

METRICS = "mu,rank_fraction,avg_abs_cos"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random GPT-2 folder, probed windows w.npz, clean windows c.npz with the
    same padding and short.npz of another length."""
    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    tf.GPT2Model(config).save_pretrained(root / "model")
    am = torch.ones(3, 12, dtype=torch.long)
    am[2, 9:] = 0
    for name, seed, n in (("w", 1, 12), ("c", 2, 12), ("short", 3, 8)):
        ids = torch.randint(1, 97, (3, n), generator=torch.Generator().manual_seed(seed))
        Windows(ids, am[:, :n], torch.zeros_like(ids, dtype=torch.bool)).save(root / f"{name}.npz")
    return root


def _argv(model_dir, *more, fmt="json"):
    return ["probe", "--model", str(model_dir / "model"), "--windows-file", str(model_dir / "w.npz"),
            "--batch-size", "2", "--metrics", METRICS, "--format", fmt, *more]


def _means(doc):
    return {(row["point"], m): row[m] for row in doc["layers"] for m in METRICS.split(",")}


def _api_means(table):
    return {(r.point, r.metric): r.mean for r in table.itertuples()}


def test_ablate_heads_gives_the_api_table(model_dir, tmp_path):
    code, out, err = check_run(_argv(model_dir, "--ablate-heads", "1.2,0.0", "--ablation", "mean"), tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ablate_heads"] == {"heads": [[1, 2], [0, 0]], "mode": "mean"}
    model = tf.GPT2Model.from_pretrained(model_dir / "model").eval()
    ablation = Intervention(ablate_heads=HeadAblation(((1, 2), (0, 0)), mode="mean"))
    want = probe(model, Windows.load(model_dir / "w.npz"), ablation, metrics=METRICS.split(","), batch_size=2,
                 progress=False)
    got, want = _means(doc), _api_means(want)
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-9)


def test_patch_gives_the_api_change(model_dir, tmp_path):
    code, out, err = check_run(_argv(model_dir, "--patch-from", str(model_dir / "c.npz"), "--patch-point",
                                     "layer.0.heads", "--patch-head", "3"), tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["patch"]["point"] == "layer.0.heads" and doc["patch"]["head"] == 3
    model = tf.GPT2Model.from_pretrained(model_dir / "model").eval()
    want = _api_means(patch(model, Windows.load(model_dir / "c.npz"), Windows.load(model_dir / "w.npz"),
                            point="layer.0.heads", head=3, metrics=METRICS.split(","), batch_size=2))
    got = _means(doc)
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-9, atol=1e-12)
    assert got[("embeddings", "mu")] == 0 and got[("layer.1.output", "mu")] != 0
    code, out, err = check_run(_argv(model_dir, "--patch-from", str(model_dir / "c.npz"), "--patch-point",
                                     "layer.1.output", fmt="table"), tmp_path)
    assert code == 0 and "change when layer.1.output is patched" in out, err


def test_ablate_heads_with_save_states_and_attentions_saves_the_ablated_model(model_dir, tmp_path):
    from rankcollapse.models import attention_maps, read_states, states_table

    states, root = tmp_path / "states", tmp_path / "run"  # the harness removes what a run leaves in its root
    root.mkdir()
    code, out, err = check_run(_argv(model_dir, "--ablate-heads", "0.2", "--save-states", str(states),
                                     "--attentions"), root)
    assert code == 0, err
    saved = read_states(states)
    assert saved.settings["ablate_heads"] == {"heads": [[0, 2]], "mode": "zero"}
    got, want = _api_means(states_table(saved, metrics=METRICS.split(","), batch_size=2)), _means(json.loads(out))
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[k] for k in want], list(want.values()), rtol=1e-9)
    model = tf.GPT2Model.from_pretrained(model_dir / "model").eval()
    maps = attention_maps(model, Windows.load(model_dir / "w.npz"), Intervention(ablate_heads=HeadAblation(((0, 2),))), batch_size=2)
    plain = attention_maps(model, Windows.load(model_dir / "w.npz"), batch_size=2)
    assert torch.equal(saved.attentions[:, 1], maps["layer.1.attention"])
    assert not torch.allclose(saved.attentions[:, 1], plain["layer.1.attention"])  # block 1 sees the ablation


def test_clip_massive_says_what_it_clipped(model_dir, tmp_path):
    code, out, err = check_run(_argv(model_dir, "--clip-massive"), tmp_path)
    assert code == 0 and "clip-massive: no window had a token with max/median norm >= 10" in err, err
    assert json.loads(out)["massive_clips"] == []


@pytest.mark.parametrize("more, why", [
    (["--ablation", "mean"], "give --ablate-heads too"),
    (["--ablate-heads", "1,2"], "write LAYER.HEAD items"),
    (["--ablate-heads", "1.4"], "--ablate-heads [(1, 4)]: the model has layers 0..1 and heads 0..3"),
    (["--ablate-heads", "1.1", "--ablation", "resample"], "unknown ablation 'resample'"),
    (["--patch-from", "c.npz", "--patch-point", "layer.0.output", "--save-states", "s"],
     "--save-states cannot be applied with --patch-from"),
    (["--patch-point", "layer.0.output"], "give --patch-from too"),
    (["--patch-from", "c.npz"], "--patch-from needs --patch-point"),
    (["--patch-from", "c.npz", "--patch-point", "layer.0.output", "--mask", "causal"],
     "--mask cannot be applied with --patch-from"),
    (["--patch-from", "short.npz", "--patch-point", "layer.0.output"], "patching needs the same windows"),
    (["--patch-from", "c.npz", "--patch-point", "layer.0.output", "--patch-head", "1"],
     "--patch-head applies at a point layer.k.heads"),
    (["--patch-from", "c.npz", "--patch-point", "layer.0.heads", "--patch-head", "4"], "--patch-head 4 outside 0..3"),
    (["--influence", "--ablate-heads", "1.1"], "--ablate-heads does not apply"),
])
def test_refusals(model_dir, tmp_path, more, why):
    more = [str(model_dir / m) if m.endswith(".npz") else m for m in more]
    argv = _argv(model_dir, *more)
    if "--influence" in more:  # it takes no --metrics
        argv = [a for a in argv if a not in ("--metrics", METRICS)]
    code, _, err = check_run(argv, tmp_path)
    assert code == 2 and why in err, err


def test_ablate_heads_of_t5_cross_attention(tmp_path):
    from rankcollapse.models import read_states
    from rankcollapse.models.states import capture_states

    torch.manual_seed(0)
    config = tf.T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                         decoder_start_token_id=0, pad_token_id=0)
    tf.T5Model(config).save_pretrained(tmp_path / "t5")
    ids = torch.randint(1, 97, (2, 8), generator=torch.Generator().manual_seed(1))
    windows = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    windows.save(tmp_path / "w.npz")
    root = tmp_path / "run"
    root.mkdir()
    code, out, err = check_run(["probe", "--model", str(tmp_path / "t5"), "--windows-file", str(tmp_path / "w.npz"),
                                "--metrics", "mu", "--format", "json", "--ablate-heads", "cross:1.2",
                                "--save-states", str(tmp_path / "states")], root)
    assert code == 0, err
    assert json.loads(out)["ablate_heads"] == {"heads": [[1, 2]], "mode": "zero", "attention": "cross"}
    model = tf.T5Model.from_pretrained(tmp_path / "t5").eval()
    want = capture_states(model, windows, Intervention(ablate_heads=HeadAblation(((1, 2),), attention="cross")))
    assert torch.equal(read_states(tmp_path / "states").hidden_states, want.hidden_states)
    code, _, err = check_run(["probe", "--model", str(tmp_path / "t5"), "--windows-file", str(tmp_path / "w.npz"),
                              "--ablate-heads", "encoder:1.2"], root)
    assert code == 2 and "unknown attention 'encoder'" in err, err
