"""A model folder saved without its tokenizer is never probed with the empty tokenizer
transformers builds for it (every window one repeated token, every metric a metric of
the position embeddings): text is refused with one line, and a tokenizer or token ids
can be brought instead (``--tokenizer``, ``--windows-file``; ``tokenizer=``, ``Windows.load``)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import transformers as tf

from rankcollapse import assets, data
from rankcollapse.data import Windows, make_windows
from rankcollapse.errors import ConfigError, DataError, TokenizerError
from rankcollapse.models import load_model, probe

from family_configs import CONFIGS

WORDS = "the river city was built near old stone bridge where people trade grain wool and salt".split()
TEXTS = [" ".join(np.random.default_rng(k).choice(WORDS, 40)) for k in range(8)]


@pytest.fixture(scope="module")
def minilm_tokenizer():
    return tf.AutoTokenizer.from_pretrained(assets.minilm_dir())


def _save(kind: str, folder, vocab: int | None = None):
    torch.manual_seed(0)
    config = CONFIGS[kind]()
    if vocab is not None:
        config.vocab_size = vocab
    tf.AutoModel.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert_dirs(tmp_path_factory, minilm_tokenizer):
    """A tiny BERT with the bert-base-uncased vocabulary, saved without and with its
    tokenizer, and the tokenizer alone."""
    root = tmp_path_factory.mktemp("bert")
    bare = _save("bert", root / "bare", vocab=len(minilm_tokenizer))
    full = _save("bert", root / "full", vocab=len(minilm_tokenizer))
    minilm_tokenizer.save_pretrained(full)
    minilm_tokenizer.save_pretrained(root / "tok")
    return {"bare": bare, "full": full, "tok": root / "tok"}


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_loading_a_tokenizer_logs_nothing(tmp_path, minilm_tokenizer):
    """A config whose special token ids lie outside its vocabulary makes transformers log a
    warning when the tokenizer reads it: nothing may stand before the one line a run prints."""
    import logging

    from rankcollapse.models.loading import load_tokenizer

    tf.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=len(minilm_tokenizer) + 7).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["bos_token_id"] = config["eos_token_id"] = config["vocab_size"] + 50  # logged once per process and text
    (tmp_path / "config.json").write_text(json.dumps(config))
    minilm_tokenizer.save_pretrained(tmp_path)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers")  # the library's root logger; it does not propagate
    logger.addHandler(handler)
    try:
        assert len(load_tokenizer(str(tmp_path))) == len(minilm_tokenizer)
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == []


@pytest.mark.parametrize("kind", ["bert", "albert", "gpt2", "t5", "llama", "mistral"])
def test_folder_without_tokenizer_loads_without_one(tmp_path, kind):
    loaded = load_model(str(_save(kind, tmp_path / kind)))
    assert loaded.tokenizer is None
    assert "no tokenizer files" in loaded.tokenizer_error
    with pytest.raises(TokenizerError, match="--tokenizer PATH_OR_NAME") as exc:
        loaded.require_tokenizer()
    assert "\n" not in str(exc.value) and str(exc.value).rstrip().endswith(")")


@pytest.mark.parametrize("kind", ["bert", "albert", "gpt2", "t5"])
def test_the_empty_tokenizer_transformers_builds_is_refused(tmp_path, kind):
    folder = _save(kind, tmp_path / kind)
    empty = tf.AutoTokenizer.from_pretrained(folder)  # what the folder gives: no ordinary vocabulary
    with pytest.raises(TokenizerError, match="ordinary tokens"):
        make_windows(TEXTS, empty, n_tokens=16, n_samples=2)
    assert data.tokenizer_problem(empty) is not None


def test_windows_of_one_ordinary_token_are_refused(minilm_tokenizer):
    # a real tokenizer on text it cannot represent: every word is [UNK]
    with pytest.raises(TokenizerError, match="window 0 .* 0 distinct ordinary tokens"):
        make_windows(["☃☃ ☃☃ ☃☃ ☃☃ ☃☃ ☃☃"] * 20, minilm_tokenizer, n_tokens=8, n_samples=2)
    with pytest.raises(TokenizerError, match="1 distinct ordinary tokens"):
        make_windows(["the " * 50], minilm_tokenizer, n_tokens=8, n_samples=2)
    # negative control: two distinct words are enough
    w = make_windows(["the river " * 50], minilm_tokenizer, n_tokens=8, n_samples=2)
    assert w.input_ids.shape == (2, 8)
    assert data.tokenizer_problem(minilm_tokenizer) is None


def test_none_or_a_non_tokenizer_is_refused():
    with pytest.raises(TokenizerError, match="no tokenizer"):
        make_windows(TEXTS, None, n_tokens=8, n_samples=1)
    with pytest.raises(TokenizerError, match="expected a transformers tokenizer, got str"):
        make_windows(TEXTS, "bert-base-uncased", n_tokens=8, n_samples=1)


def test_cli_refuses_a_folder_without_tokenizer(monkeypatch, capsys, tmp_path, bert_dirs):
    code, out, err = _main(monkeypatch, capsys, "--model", str(bert_dirs["bare"]), "--n-samples", "2", "--n-tokens", "16",
                           "--out", str(tmp_path / "o"))
    assert code == 2 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith("rankcollapse: error:") and "no tokenizer files" in line and "--tokenizer" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("given", ["", " "])
def test_an_empty_tokenizer_name_is_named_as_the_tokenizer(bert_dirs, given):
    """``--tokenizer ''``: once read as the working directory, then named as an empty model."""
    with pytest.raises(TokenizerError) as info:
        load_model(str(bert_dirs["bare"]), tokenizer=given)
    assert str(info.value) == f"tokenizer {given!r} is empty; give 'minilm', 'smollm2', a tokenizer folder or a hub name"


def test_tokenizer_option_gives_the_numbers_of_the_complete_folder(monkeypatch, capsys, bert_dirs, tmp_path):
    args = ("--n-samples", "2", "--n-tokens", "16", "--format", "json")
    code, full, err = _main(monkeypatch, capsys, "--model", str(bert_dirs["full"]), *args, "--out", str(tmp_path / "o"))
    assert code == 0, err
    for tok in (str(bert_dirs["tok"]), "minilm"):
        code, given, err = _main(monkeypatch, capsys, "--model", str(bert_dirs["bare"]), "--tokenizer", tok, *args)
        assert code == 0, err
        assert json.loads(given)["layers"] == json.loads(full)["layers"]
    # the windows file --out wrote gives the same numbers, with no tokenizer at all
    code, again, err = _main(monkeypatch, capsys, "--model", str(bert_dirs["bare"]), "--windows-file",
                             str(tmp_path / "o" / "windows.npz"), "--format", "json")
    assert code == 0, err
    doc = json.loads(again)
    assert doc["layers"] == json.loads(full)["layers"] and (doc["n_samples"], doc["n_tokens"]) == (2, 16)


@pytest.mark.parametrize("extra, text", [
    (("--n-tokens", "32"), "--n-tokens 32 but"),
    (("--n-samples", "5"), "--n-samples 5 but"),
    (("--seed", "3"), "--seed"),
    (("--tokenizer", "minilm"), "--tokenizer would cut other windows"),
    (("--text-file", "docs.txt"), "--text-file would cut other windows"),
])
def test_windows_file_refuses_options_that_make_other_windows(monkeypatch, capsys, tmp_path, bert_dirs, extra, text):
    wins = Windows(torch.arange(5, 37).view(2, 16), torch.ones(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.bool))
    wins.save(tmp_path / "w.npz")
    code, _, err = _main(monkeypatch, capsys, "--model", str(bert_dirs["bare"]), "--windows-file", str(tmp_path / "w.npz"),
                         *extra)
    assert code == 2 and text in err and len(err.strip().splitlines()) == 1


def test_a_tokenizer_of_another_model_is_refused(tmp_path, minilm_tokenizer):
    folder = _save("gpt2", tmp_path / "gpt2")  # 97 embeddings, bert tokenizer has 30522 tokens
    with pytest.raises(TokenizerError, match="30522 tokens but the model only 97"):
        load_model(str(folder), tokenizer="minilm")
    with pytest.raises(TokenizerError, match="ordinary tokens"):
        load_model(str(folder), tokenizer=tf.AutoTokenizer.from_pretrained(folder))
    with pytest.raises(Exception) as exc:  # a folder with nothing to load: one complete line
        load_model(str(folder), tokenizer=str(tmp_path))
    assert "cannot load a tokenizer" in str(exc.value) and "\n" not in str(exc.value)


def test_token_ids_beyond_the_embeddings_are_refused_before_the_forward(make_tiny):
    loaded = make_tiny("gpt2")  # 97 embeddings
    ids = torch.tensor([[5, 6, 97, 8]])
    wins = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    with pytest.raises(ConfigError, match="token id 97 is beyond tiny-gpt2's 97 embeddings"):
        probe(loaded, wins)
    from rankcollapse.models import attention_maps, embed

    for f in (embed, attention_maps):
        with pytest.raises(ConfigError, match="beyond"):
            f(loaded, wins)


@pytest.mark.parametrize("arrays, match", [
    (dict(input_ids=np.full((2, 4), 3.7)), "not integers"),
    (dict(input_ids=np.array([[1, -2, 3, 4], [1, 2, 3, 4]])), "negative id"),
    (dict(attention_mask=np.full((2, 4), 2)), "only 0/1"),
    (dict(attention_mask=np.ones((2, 5), dtype=np.int64)), "attention_mask has shape"),
    (dict(attention_mask=np.array([[1, 1, 1, 1], [0, 0, 0, 0]])), "window 1 has no real token"),
    (dict(input_ids=np.arange(4)[None, :1], attention_mask=np.ones((1, 1), dtype=np.int64),
          special_tokens_mask=np.zeros((1, 1), dtype=bool)), "shape"),
    (dict(special_tokens_mask=np.full((2, 4), 0.5)), "special_tokens_mask must hold only 0/1"),
])
def test_windows_files_that_are_not_windows_are_refused(tmp_path, arrays, match):
    base = dict(input_ids=np.arange(8).reshape(2, 4), attention_mask=np.ones((2, 4), dtype=np.int64),
                special_tokens_mask=np.zeros((2, 4), dtype=bool))
    np.savez(tmp_path / "w.npz", **{**base, **arrays})
    with pytest.raises(DataError, match=match):
        Windows.load(tmp_path / "w.npz")


def test_a_multi_line_transformers_reason_is_kept_whole_on_one_line(tmp_path, monkeypatch):
    folder = _save("llama", tmp_path / "llama")
    (folder / "tokenizer.json").write_text("{}")  # a tokenizer file transformers cannot use

    def fails(*args, **kwargs):
        raise ValueError("Couldn't instantiate the backend tokenizer from one of: \n(1) a file, \n(2) a slow tokenizer")

    monkeypatch.setattr(tf.AutoTokenizer, "from_pretrained", fails)
    loaded = load_model(str(folder))
    assert loaded.tokenizer is None and "\n" not in loaded.tokenizer_error
    assert "one of: (1) a file, (2) a slow tokenizer" in loaded.tokenizer_error


def _no_model_load(monkeypatch):
    """Make any model load fail loudly: a refusal that needs no model must come first."""
    from rankcollapse.models import loading

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(loading, "_from_pretrained", refuse)


@pytest.mark.parametrize("case, text", [
    ("bare", "holds no tokenizer files"),
    ("short", "fewer than one window"),
    ("points", "--points 'bogus'"),
    ("huge", "describes 1e+11 parameters"),
])
def test_refusals_that_need_no_model_come_before_it_loads(monkeypatch, capsys, tmp_path, bert_dirs, case, text):
    args = {"bare": ["--model", str(bert_dirs["bare"])],
            "short": ["--model", str(bert_dirs["full"]), "--text-file", str(tmp_path / "short.txt")],
            "points": ["--model", str(bert_dirs["full"]), "--points", "bogus"],
            "huge": ["--model", str(tmp_path / "huge"), "--tokenizer", str(bert_dirs["tok"])]}[case]
    (tmp_path / "short.txt").write_text("the river city\n")
    huge = CONFIGS["bert"]()
    huge.vocab_size = 10**11 // huge.hidden_size  # the word embeddings alone: 1e11 parameters
    huge.save_pretrained(tmp_path / "huge")
    _no_model_load(monkeypatch)
    code, out, err = _main(monkeypatch, capsys, *args, "--n-tokens", "16", "--n-samples", "2")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and text in lines[0], err


def test_model_notes_come_only_after_success(monkeypatch, capsys, bert_dirs):
    from rankcollapse.models import loading

    monkeypatch.setattr(loading, "check_loaded_weights", lambda model, info, source: ["a note on the weights"])
    base = ["--model", str(bert_dirs["full"]), "--n-tokens", "16", "--n-samples", "2", "--metrics", "mu"]
    code, _, err = _main(monkeypatch, capsys, *base, "--drop", "skip:99")  # refused once the layers are known
    assert code == 2 and len(err.strip().splitlines()) == 1 and "skip:99" in err, err
    code, _, err = _main(monkeypatch, capsys, *base)
    assert code == 0 and "note: a note on the weights" in err, err


def test_a_fifo_as_windows_file_is_refused_not_waited_on(monkeypatch, capsys, tmp_path, bert_dirs):
    import os

    os.mkfifo(tmp_path / "w.npz")
    code, _, err = _main(monkeypatch, capsys, "--model", str(bert_dirs["full"]), "--windows-file", str(tmp_path / "w.npz"))
    assert code == 2 and "not a regular file" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DataError, match="not a regular file"):
        Windows.load(tmp_path / "w.npz")
