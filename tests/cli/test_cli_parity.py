"""``probe --parity``: the parity table of a local model folder, and the options it cannot
apply refused with one line."""

import json

import pytest
import torch
import transformers as tf

from rankcollapse.data import Windows

from ._harness import check_run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    tf.GPT2Model(config).save_pretrained(root / "model")
    ids = torch.randint(1, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool)).save(root / "w.npz")
    return root


def test_parity_table(model_dir, tmp_path):
    base = ["probe", "--model", str(model_dir / "model"), "--windows-file", str(model_dir / "w.npz"), "--parity"]
    code, out, err = check_run([*base, "--format", "json"], tmp_path)
    assert code == 0, err
    (doc,) = json.loads(out)["models"]
    assert doc["dtype"] == "float32" and doc["family"] == "gpt2"
    assert [p["point"] for p in doc["points"]] == ["embeddings", "layer.0.output", "final_norm"]
    assert all(p["ok"] and p["max_abs_diff"] == 0 for p in doc["points"])
    for extra, flag in ((["--mask", "causal"], "--mask"), (["--out", "o"], "--out"), (["--drop", "mlp"], "--drop")):
        code, _, err = check_run([*base, *extra], tmp_path)
        assert code == 2 and f"{flag} cannot be applied: --parity" in err, err


def test_max_memory_micro_batches_the_metrics_run(model_dir, tmp_path):
    """--max-memory: the JSON says the batch size that fits and the predicted peak; a bad
    size and the runs that cannot apply it are refused with one line."""
    base = ["probe", "--model", str(model_dir / "model"), "--windows-file", str(model_dir / "w.npz")]
    code, out, err = check_run([*base, "--max-memory", "1GiB", "--batch-size", "2", "--format", "json"], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["batch_size"] == 2 and 0 < doc["predicted_peak_bytes"] < 2**30
    assert "batches of 2 windows" in err
    for extra, flag in ((["--max-memory", "lots"], "--max-memory must be a size"),
                        (["--max-memory", "1GiB", "--parity"], "--max-memory cannot be applied: --parity"),
                        (["--max-memory", "1kB"], "probing one window")):
        code, _, err = check_run([*base, *extra], tmp_path)
        assert code == 2 and flag in err and len(err.strip().splitlines()) == 1, err
