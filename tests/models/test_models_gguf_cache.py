"""The GGUF weights cache: a cached load is the uncached load bit for bit, keyed by the
file's content, and an entry that does not match its record is never used."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rankcollapse.models import load_model, loading

D, FF, LAYERS, VOCAB = 16, 32, 2, 64


def write_gguf(path, seed):
    """A tiny Llama GGUF file (2 blocks, d = 16) of seeded random weights; returns its folder."""
    import gguf

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(32)
    w.add_embedding_length(D)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FF)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D // 2)
    w.add_vocab_size(VOCAB)
    shapes = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,)}
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.ffn_norm.weight": (D,),
                   f"blk.{i}.ffn_gate.weight": (FF, D), f"blk.{i}.ffn_up.weight": (FF, D),
                   f"blk.{i}.ffn_down.weight": (D, FF)}
        shapes |= {f"blk.{i}.attn_{n}.weight": (D, D) for n in ("q", "k", "v", "output")}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path.parent)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(loading.GGUF_CACHE_ENV, str(folder))
    return folder


def _uncached(folder, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv(loading.GGUF_CACHE_ENV, "off")
        return load_model(folder, gguf_file="m.gguf")


def _no_conversion(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was converted again")

    monkeypatch.setattr(loading, "_load_online_or_cached", refuse)


def _assert_same(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert list(sa) == list(sb) and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)
    assert type(a.model) is type(b.model) and a.model.config.to_dict() == b.model.config.to_dict()
    ids = torch.arange(12).reshape(2, 6)
    assert torch.equal(a.model(input_ids=ids).last_hidden_state, b.model(input_ids=ids).last_hidden_state)


def test_cached_load_equals_the_conversion_bit_for_bit(tmp_path, cache, monkeypatch):
    folder = write_gguf(tmp_path / "model" / "m.gguf", seed=0)
    reference = _uncached(folder, monkeypatch)
    assert not cache.exists()
    first = load_model(folder, gguf_file="m.gguf")  # converts and writes the entry
    assert len(list(cache.glob("*.safetensors"))) == 1 and len(list(cache.glob("*.json"))) == 1
    _no_conversion(monkeypatch)
    again = load_model(folder, gguf_file="m.gguf")
    _assert_same(again, reference)
    _assert_same(first, reference)
    assert again.family == "llama" and again.notes == reference.notes
    assert again.model.config.name_or_path == folder


def test_new_content_at_the_same_path_misses_the_cache(tmp_path, cache, monkeypatch):
    path = tmp_path / "model" / "m.gguf"
    folder = write_gguf(path, seed=0)
    old = load_model(folder, gguf_file="m.gguf")
    write_gguf(path, seed=1)  # same path and size, other weights
    new = load_model(folder, gguf_file="m.gguf")
    assert not torch.equal(new.model.embed_tokens.weight, old.model.embed_tokens.weight)
    _assert_same(new, _uncached(folder, monkeypatch))
    assert len(list(cache.glob("*.safetensors"))) == 2


def test_another_dtype_is_another_entry(tmp_path, cache):
    folder = write_gguf(tmp_path / "model" / "m.gguf", seed=0)
    load_model(folder, gguf_file="m.gguf")
    half = load_model(folder, gguf_file="m.gguf", dtype=torch.float16)
    assert half.dtype == torch.float16 and len(list(cache.glob("*.json"))) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "record"])
def test_a_damaged_entry_is_ignored_and_written_again(tmp_path, cache, monkeypatch, damage):
    folder = write_gguf(tmp_path / "model" / "m.gguf", seed=0)
    reference = load_model(folder, gguf_file="m.gguf")
    weights, record = next(cache.glob("*.safetensors")), next(cache.glob("*.json"))
    good = weights.read_bytes()
    if damage == "flip":  # same size, one weight byte changed
        blob = bytearray(good)
        blob[-5] ^= 0xFF
        weights.write_bytes(bytes(blob))
    elif damage == "truncate":
        weights.write_bytes(good[: len(good) // 2])
    else:
        record.write_text("{not json", encoding="utf-8")
    _assert_same(load_model(folder, gguf_file="m.gguf"), reference)
    assert weights.read_bytes() == good and json.loads(record.read_text(encoding="utf-8"))["bytes"] == len(good)
    _no_conversion(monkeypatch)
    _assert_same(load_model(folder, gguf_file="m.gguf"), reference)


def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(loading.GGUF_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert loading.gguf_cache_dir() == tmp_path / "xdg" / "rankcollapse" / "gguf"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored (XDG specification)
    assert loading.gguf_cache_dir() == loading.Path.home() / ".cache" / "rankcollapse" / "gguf"
    monkeypatch.setenv(loading.GGUF_CACHE_ENV, str(tmp_path / "elsewhere"))
    assert loading.gguf_cache_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv(loading.GGUF_CACHE_ENV, "off")
    assert loading.gguf_cache_dir() is None


def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(loading.GGUF_CACHE_ENV, "off")
    load_model(write_gguf(tmp_path / "model" / "m.gguf", seed=0), gguf_file="m.gguf")
    assert not (tmp_path / "xdg").exists()


def test_a_cache_that_cannot_be_written_warns_and_the_load_goes_on(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder", encoding="utf-8")
    monkeypatch.setenv(loading.GGUF_CACHE_ENV, str(blocker / "cache"))
    folder = write_gguf(tmp_path / "model" / "m.gguf", seed=0)
    with pytest.warns(UserWarning, match="cannot write the GGUF weights cache"):
        loaded = load_model(folder, gguf_file="m.gguf")
    _assert_same(loaded, _uncached(folder, monkeypatch))
