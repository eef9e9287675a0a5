"""A unit's key follows the content of what it reads: a model folder overwritten in place
gives new keys and new numbers; the same content under another path gives the same key."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

from rankcollapse import assets
from rankcollapse.experiments import runner
from rankcollapse.models.loading import model_digest, model_key
from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep.context import RunContext


@pytest.fixture(scope="module")
def tokenizer():
    return tf.AutoTokenizer.from_pretrained(assets.minilm_dir())


def _save_bert(folder, seed: int, tokenizer) -> None:
    """A tiny random BERT with ``tokenizer``, weights drawn with ``seed``."""
    torch.manual_seed(seed)
    config = tf.BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=32)
    tf.BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _run_fig4(folder, cache: UnitCache):
    """``reproduce fig4 --model FOLDER`` at smoke scale, the folder's units only."""
    _, units, data = runner.plan("fig4", "smoke", 0, n_tokens=16,
                                 overrides={"extra_models": [str(folder)], "n_samples": 2})
    own = [u for u in units if u.params["model"] == str(folder)]
    assert [u.kind for u in own] == ["probe"]
    table, timings = runner.compute_units(own, RunContext(data), cache, progress=False)
    mu = table[(table["metric"] == "mu_relative") & (table["point"].str.startswith("layer."))]
    return own[0].hash, mu.set_index("layer")["mean"].sort_index(), [t["cached"] for t in timings]


def test_a_model_folder_overwritten_in_place_is_computed_again(tmp_path, tokenizer):
    folder, cache = tmp_path / "my_model", UnitCache(tmp_path / "cache")
    _save_bert(folder, 0, tokenizer)
    key0, mu0, cached0 = _run_fig4(folder, cache)
    key1, mu1, cached1 = _run_fig4(folder, cache)
    assert cached0 == [False] and cached1 == [True] and key1 == key0  # unchanged weights: read back
    np.testing.assert_array_equal(mu1.to_numpy(), mu0.to_numpy())  # the same entry, read back

    _save_bert(folder, 1, tokenizer)  # new weights saved into the same folder
    key2, mu2, cached2 = _run_fig4(folder, cache)
    assert cached2 == [False] and key2 != key0
    assert list(mu2.index) == list(mu0.index) == [1, 2]
    # other random weights give other per-layer numbers (they differ far above round-off)
    assert np.all(np.abs(mu2.to_numpy() - mu0.to_numpy()) > 1e-4 * np.abs(mu0.to_numpy()))


def test_the_key_is_the_content_not_the_path(tmp_path, tokenizer):
    a, b = tmp_path / "a", tmp_path / "b"
    _save_bert(a, 0, tokenizer)
    b.mkdir()
    for f in a.iterdir():  # the same bytes under another path
        (b / f.name).write_bytes(f.read_bytes())
    assert model_digest(str(b)) == model_digest(str(a))
    (b / "README.md").write_text("notes")  # a file no load reads
    assert model_digest(str(b)) == model_digest(str(a))
    (b / "config.json").write_text((a / "config.json").read_text().replace('"hidden_act": "gelu"', '"hidden_act": "relu"'))
    assert model_digest(str(b)) != model_digest(str(a))  # a changed config is another model


def test_packaged_models_are_keyed_by_their_pinned_content(tmp_path):
    # the installed files are the pinned version's: the name stands for that content
    for name in ("minilm", "smollm2"):
        assert model_digest(name) == assets.PINNED_DIGESTS[name]
        assert model_key(name) == {}
    # the same files under a path of their own: keyed by their digest, the pinned one
    copy = tmp_path / "minilm"
    copy.mkdir()
    for f in assets.minilm_dir().iterdir():
        if f.is_file():
            (copy / f.name).symlink_to(f)
    assert model_key(str(copy)) == {"model_sha256": assets.PINNED_DIGESTS["minilm"]}


def test_a_text_file_is_keyed_by_its_content_not_its_path(tmp_path):
    text = "\n\n".join(f"Document {i} is about topic {i} and has several words in it." for i in range(40))
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.txt").write_text(text)
    (tmp_path / "c.txt").write_text(text.replace("topic 3", "subject 3"))
    keys = {name: [u.hash for u in runner.plan("fig3", "smoke", 0, text=tmp_path / name)[1]] for name in ("a.txt", "b.txt", "c.txt")}
    assert keys["a.txt"] == keys["b.txt"]
    assert not set(keys["a.txt"]) & set(keys["c.txt"])


def test_a_mask_file_is_keyed_by_its_content(tmp_path):
    import numpy as np

    causal, full = np.tril(np.ones((128, 128), dtype=bool)), np.ones((128, 128), dtype=bool)
    np.save(tmp_path / "m.npy", causal)

    def keys(name):
        units = runner.plan("main", "smoke", 0, overrides={"masks": [f"file:{tmp_path / name}"]})[1]
        return {u.hash for u in units if "file:" in str(u.params.get("mask", ""))}, {u.hash for u in units}

    own0, all0 = keys("m.npy")
    assert own0 and keys("m.npy") == (own0, all0)
    np.save(tmp_path / "m.npy", full)  # another mask saved under the same name
    own1, all1 = keys("m.npy")
    assert not own0 & own1 and all0 - own0 == all1 - own1  # only the units of that mask move
    assert len(own1) == len(own0)


def test_the_packaged_corpus_is_keyed_by_name_only_while_it_is_the_pinned_version(monkeypatch):
    pinned = runner.plan("fig4", "smoke", 0)
    assert pinned[2] == {"corpus": "wikipedia", "n_tokens": 128, "seed": 0}
    # another version of the package installed: its digest enters the data spec and every key
    monkeypatch.setitem(assets.PINNED_DIGESTS, "wikipedia", "0" * 16)
    other = runner.plan("fig4", "smoke", 0)
    assert other[2]["sha256"] == assets.wikipedia_key()["sha256"] != "0" * 16
    assert not {u.hash for u in pinned[1]} & {u.hash for u in other[1]}
