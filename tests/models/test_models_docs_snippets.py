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
