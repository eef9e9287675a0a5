"""``probe --save-states``, ``probe --hidden-states`` and ``metrics --states``: capture
with one command, measure with another, the same table; bad folders and options that
cannot apply are one line and exit 2, with nothing left behind."""

import json
import os

import pytest
import torch
import transformers as tf

from rankcollapse.data import Windows

from ._harness import check_run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random GPT-2 folder and a windows file for it (one window right-padded)."""
    root = tmp_path_factory.mktemp("tiny")
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=97, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    tf.GPT2Model(config).save_pretrained(root / "model")
    ids = torch.randint(1, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    am = torch.ones_like(ids)
    am[2, 9:] = 0
    Windows(ids, am, torch.zeros_like(ids, dtype=torch.bool)).save(root / "w.npz")
    return root


def _live(model_dir):
    return ["probe", "--model", str(model_dir / "model"), "--windows-file", str(model_dir / "w.npz"),
            "--batch-size", "2", "--metrics", "mu,rank_fraction,effective_rank,avg_abs_cos"]


def test_saved_states_give_the_probe_table(model_dir, tmp_path):
    code, live, err = check_run([*_live(model_dir), "--format", "csv", "--save-states", "states"], tmp_path)
    assert code == 0, err
    # check_run removes what a successful run wrote: run again, keeping the folder
    from ._harness import invoke

    code, live, err = invoke([*_live(model_dir), "--format", "csv", "--save-states", "states"], tmp_path)
    assert code == 0 and "wrote states/states.safetensors (3, 4, 12, 32) (window, point, token, d)" in err
    side = json.loads((tmp_path / "states" / "states.json").read_text())
    assert side["points"] == ["embeddings", "layer.0.output", "layer.1.output", "final_norm"]
    assert side["window_ids"] == [0, 1, 2] and side["dtype"] == "float32"
    names = ["--metrics", "mu,rank_fraction,effective_rank,avg_abs_cos", "--format", "csv"]
    code, from_metrics, err = check_run(["metrics", "--states", "states", *names], tmp_path)
    assert code == 0, err
    code, from_probe, err = check_run(["probe", "--hidden-states", "states", "--batch-size", "2", *names], tmp_path)
    assert code == 0, err
    assert from_metrics == from_probe == live
    code, doc, err = check_run(["metrics", "--states", "states", "--format", "json"], tmp_path)
    assert code == 0 and json.loads(doc)["layers"][3]["point"] == "final_norm"
    code, _, err = invoke(["probe", "--hidden-states", "states", "--out", "o"], tmp_path)
    assert code == 0 and sorted(p.name for p in (tmp_path / "o").iterdir() if not p.name.startswith(".")) == \
        ["COMPLETE", "probe.csv", "probe.json", "probe.png"]


def test_saved_attention_rows_give_the_probe_attention_entropy(model_dir, tmp_path):
    from ._harness import invoke

    live_argv = [*_live(model_dir)[:-2], "--metrics", "attention_entropy,mu", "--format", "csv"]
    code, live, err = invoke([*live_argv, "--attentions", "--save-states", "states"], tmp_path)
    assert code == 0, err
    code, read, err = check_run(["metrics", "--states", "states", "--metrics", "attention_entropy,mu",
                                 "--format", "csv"], tmp_path)
    assert code == 0 and read == live and "layer.1.attention" in read, err


@pytest.mark.parametrize("argv, why", [
    (["metrics"], "give FILE (a .npy or .pt token array) or --states DIR"),
    (["metrics", "x.npy", "--states", "states"], "give FILE or --states, not both"),
    (["metrics", "--states", "states", "--padding-mask", "m.npy"], "--padding-mask cannot be applied"),
    (["metrics", "--states", "states", "--dtype", "float32"], "--dtype cannot be applied"),
    (["probe", "--hidden-states", "states", "--model", "minilm"], "--model cannot be applied"),
    (["probe", "--hidden-states", "states", "--mask", "causal"], "--mask cannot be applied"),
    (["probe", "--hidden-states", "states", "--metrics", "sink_mass"], "the sink metrics need the model"),
    (["metrics", "--states", "nowhere"], "does not exist or is not a folder"),
    (["metrics", "--states", "empty"], "holds neither states.json"),
    (["metrics", "--states", "fifo"], "is not a regular file"),
    (["metrics", "--states", "nosidecar"], "states.json' is missing"),
])
def test_refusals_are_one_line(tmp_path, argv, why):
    (tmp_path / "states").mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "hidden_states.safetensors")
    (tmp_path / "nosidecar").mkdir()
    (tmp_path / "nosidecar" / "states.safetensors").write_bytes(b"")
    code, _, err = check_run(argv, tmp_path)
    assert code == 2 and why in err, err


def test_save_states_refusals(model_dir, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    for extra, why in ((["--save-states", "o", "--out", "o"], "a folder of its own, not the --out folder"),
                       (["--save-states", "o", "--control", "random-init"], "drop --control"),
                       (["--save-states", "o", "--points", "hidden_states,module:h.0.attn"],
                        "module:h.0.attn (a module's output) is not one of them"),
                       (["--save-states", "mine"], "--save-states 'mine' is a non-empty folder that no run wrote")):
        code, _, err = check_run([*_live(model_dir), *extra], tmp_path)
        assert code == 2 and why in err, err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
