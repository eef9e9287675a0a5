"""The number of windows is ``n_samples`` in the windows API (issue 28): ``make_windows``,
``Windows`` and the run context's ``windows``/``embeddings``. The new name (and a
positional call) is silent, the old ``n_windows`` warns once (FutureWarning naming
0.3.0, pointing at the caller) and gives the identical result, and the old and the new
name together are refused."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import warnings

import pytest
import torch
from transformers import AutoTokenizer

from rankcollapse import assets, data
from rankcollapse.errors import ConfigError
from rankcollapse.sweep.context import RunContext

TEXTS = ["the river flows past the old mill and under the stone bridge " * 6] * 8


@pytest.fixture(scope="module")
def bert_tokenizer():
    return AutoTokenizer.from_pretrained(assets.minilm_dir())


@pytest.fixture(scope="module")
def run_context(tmp_path_factory):
    """A run context on a small text file with MiniLM (loaded once)."""
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    ctx = RunContext({"corpus": "file", "path": str(path), "n_tokens": 12, "seed": 3})
    ctx.model("minilm")
    return ctx


def _fresh(ctx):
    """A context sharing ``ctx``'s loaded model but none of its cached windows, so every
    spelling computes its own result."""
    new = RunContext(ctx.data)
    new._models = ctx._models
    return new


def _windows_tuple(w):
    return tuple(t.clone() for t in (w.input_ids, w.attention_mask, w.special_tokens_mask))


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _one_warning(call, old):
    with pytest.warns(FutureWarning) as rec:
        result = call()
    assert len(rec) == 1, [str(w.message) for w in rec]
    assert str(rec[0].message).endswith(f"({old}=...) is deprecated and will be removed in 0.3.0; use n_samples=")
    assert rec[0].filename == __file__  # pointing at the caller
    return result


def test_make_windows_n_samples_and_its_old_name(bert_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = _windows_tuple(data.make_windows(TEXTS, bert_tokenizer, n_tokens=10, n_samples=3, seed=1))
    old = _windows_tuple(_one_warning(
        lambda: data.make_windows(TEXTS, bert_tokenizer, n_tokens=10, n_windows=3, seed=1), "n_windows"))
    assert new[0].shape == (3, 10) and _same(old, new)
    with pytest.raises(ConfigError, match=r"give n_samples= or the deprecated n_windows=, not both \(n_samples was given by keyword\)"):
        data.make_windows(TEXTS, bert_tokenizer, n_tokens=10, n_samples=3, n_windows=3)


def test_windows_n_samples_and_its_deprecated_property(bert_tokenizer):
    w = data.make_windows(TEXTS, bert_tokenizer, n_tokens=10, n_samples=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert w.n_samples == 3 == w.input_ids.shape[0]
    with pytest.warns(FutureWarning, match=r"Windows\.n_windows is deprecated and will be removed in 0\.3\.0; use \.n_samples") as rec:
        assert w.n_windows == 3
    assert len(rec) == 1 and rec[0].filename == __file__
    with pytest.raises((AttributeError, dataclasses.FrozenInstanceError)):  # read-only
        w.n_windows = 4
    assert "n_windows" not in {f.name for f in dataclasses.fields(w)}


@pytest.mark.parametrize("method", ["windows", "embeddings"])
def test_run_context_n_samples_by_position_by_name_and_by_the_old_name(run_context, method):
    def call(how):
        f = getattr(_fresh(run_context), method)
        got = f("minilm", 3) if how == "position" else f("minilm", **{how: 3})
        return _windows_tuple(got) if method == "windows" else (got.clone(),)

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        by_position, by_name = call("position"), call("n_samples")
    by_old_name = _one_warning(lambda: call("n_windows"), "n_windows")
    assert by_position[0].shape[:2] == (3, 12)
    assert _same(by_name, by_position) and _same(by_old_name, by_position)
    f = getattr(_fresh(run_context), method)
    with pytest.raises(ConfigError, match=r"give n_samples= or the deprecated n_windows=, not both \(n_samples was given by keyword\)"):
        f("minilm", n_samples=3, n_windows=3)
    with pytest.raises(ConfigError, match=r"not both \(n_samples was given by position\)"):
        f("minilm", 3, n_windows=3)


def test_no_public_function_takes_the_samples_as_n_windows():
    import rankcollapse

    todo, found = [rankcollapse], {}
    while todo:
        pkg = todo.pop()
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1].startswith("_") or info.name == "rankcollapse.cli":
                continue
            mod = importlib.import_module(info.name)
            if info.ispkg:
                todo.append(mod)
            for attr, obj in vars(mod).items():
                if attr.startswith("_") or getattr(obj, "__module__", None) != info.name:
                    continue
                members = [(attr, obj)] if inspect.isfunction(obj) else [
                    (f"{attr}.{m}", getattr(fn, "__func__", fn)) for m, fn in vars(obj).items()
                    if inspect.isclass(obj) and not m.startswith("_")]
                found.update({f"{info.name}.{q}": fn for q, fn in members if inspect.isfunction(fn)})
    assert len(found) > 400
    assert [q for q, fn in found.items() if "n_windows" in inspect.signature(fn).parameters] == []
    renamed = {q for q, fn in found.items() if "n_windows" in getattr(fn, "__renamed__", {})}
    assert renamed == {"rankcollapse.data.make_windows", "rankcollapse.sweep.context.RunContext.windows",
                       "rankcollapse.sweep.context.RunContext.embeddings"}
