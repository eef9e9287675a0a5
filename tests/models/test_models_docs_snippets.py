"""Every ``python`` snippet of docs/models.md runs as written, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _snippets() -> list[str]:
    return _BLOCK.findall(DOC.read_text(encoding="utf-8"))


def test_snippets_compile():
    blocks = _snippets()
    assert len(blocks) >= 4
    for i, code in enumerate(blocks):
        compile(code, f"docs/models.md snippet {i}", "exec")


@pytest.mark.slow
def test_snippets_run_in_order(monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    namespace: dict = {}
    for i, code in enumerate(_snippets()):
        exec(compile(code, f"docs/models.md snippet {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "cannot load model 'gpt2'" in out and "torch.Size([2, 32, 576])" in out
    assert namespace["X0"].shape == (16, 128, 384)
    assert set(namespace["df"]["metric"]) >= {"mu"}


def test_point_names_table_lists_what_recorder_accepts():
    """Every name of the "Point names" table (k = 0) is one ``Recorder`` accepts and records
    on a tiny GPT-2; the attention names, which the text names as table-only, are refused."""
    import torch
    import transformers as tf

    from rankcollapse.errors import ModelError
    from rankcollapse.models import LoadedModel, Recorder, detect_family

    section = DOC.read_text(encoding="utf-8").split("## Point names", 1)[1].split("\n## ", 1)[0]
    names = []
    for cell in re.findall(r"^\| `([^`]+)`", section, re.M):
        if not cell.startswith("module:"):
            names.append(cell.replace("layer.k.", "layer.0."))
    assert "layer.0.output" in names and "final_norm" in names and len(names) >= 7
    assert not any(".attention" in n for n in names)
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=31, n_embd=8, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    model = tf.AutoModel.from_config(config, attn_implementation="eager").eval()
    loaded = LoadedModel(model=model, tokenizer=None, family=detect_family(model), name="tiny-gpt2", notes=[])
    with Recorder(loaded, names) as rec, torch.no_grad():
        model(torch.arange(5)[None])
    assert set(rec.outputs) == set(names)
    for refused in ("layer.0.attention", "layer.0.attention.head_0"):
        assert refused.replace("layer.0.", "layer.k.").replace("head_0", "head_h") in section
        with pytest.raises(ModelError, match="unknown recording point"):
            Recorder(loaded, [refused])
