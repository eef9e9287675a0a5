"""`probe --attentions` and `--device` on real MiniLM through the CLI entry point."""

import sys

import numpy as np
import pytest

from family_configs import word_docs
import torch

from rankcollapse.data import Windows
from rankcollapse.models import load_model

WORDS = "the river city was built near old stone bridge where people trade grain wool and salt every year".split()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return word_docs(tmp_path_factory.mktemp("text") / "docs.txt", WORDS, 60)


def _main(monkeypatch, *args):
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code


def test_attentions_equal_the_model_own_eager_maps_within_float32(monkeypatch, capsys, text_file, tmp_path):
    from rankcollapse.cli import main

    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", "--model", "minilm", "--text-file", str(text_file), "--n-samples", "2",
                                      "--n-tokens", "24", "--format", "json", "--out", str(out), "--attentions", "--device", "cpu"])
    main()
    capsys.readouterr()
    maps = np.load(out / "attentions.npz")
    assert sorted(maps.files) == [f"layer.{k}.attention" for k in range(6)]
    wins = Windows.load(out / "windows.npz")
    eager = load_model("minilm", attn_implementation="eager")
    with torch.no_grad():
        ref = eager.model(input_ids=wins.input_ids, attention_mask=wins.attention_mask, output_attentions=True).attentions
    for k, a in enumerate(ref):
        got = maps[f"layer.{k}.attention"]
        assert got.shape == (2, 12, 24, 24)
        # MiniLM loads with SDPA: rows recomputed from the kernel's queries and keys, whose
        # hidden states differ from eager attention's in the last float32 bits
        np.testing.assert_allclose(got, a.numpy(), rtol=1e-4, atol=1e-5)


def test_sdpa_model_keeps_sdpa_while_recording_attentions():
    from rankcollapse.models import Recorder

    loaded = load_model("minilm")
    assert loaded.model.config._attn_implementation == "sdpa"
    with Recorder(loaded, [], attentions=True):
        assert loaded.model.config._attn_implementation == "sdpa"
    assert loaded.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize(
    "extra, text",
    [
        (["--device", "cuda:7"], "not available"),
        (["--device", "nonsense"], "not a torch device"),
        (["--attentions"], "--out"),
    ],
)
def test_bad_device_or_attentions_without_out_exit_2(monkeypatch, capsys, text_file, extra, text):
    code = _main(monkeypatch, "--model", "minilm", "--text-file", str(text_file), "--n-samples", "1", "--n-tokens", "16", *extra)
    err = capsys.readouterr().err.strip()
    assert code == 2 and text in err and len(err.splitlines()) == 1


def test_device_cpu_is_the_unchanged_default(monkeypatch, capsys, text_file):
    import json

    from rankcollapse.cli import main

    docs = []
    for extra in ([], ["--device", "cpu"]):
        monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", "--model", "minilm", "--text-file", str(text_file),
                                          "--n-samples", "1", "--n-tokens", "16", "--format", "json", *extra])
        main()
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0] == docs[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe_matches_cpu(text_file):
    from rankcollapse.data import make_windows, read_text_file
    from rankcollapse.models import probe

    cpu = load_model("minilm")
    gpu = load_model("minilm", device="cuda")
    w = make_windows(read_text_file(text_file), cpu.tokenizer, n_tokens=24, n_samples=2, allow_fewer=True)
    a, b = probe(cpu, w, metrics=("mu", "rank_fraction")), probe(gpu, w, metrics=("mu", "rank_fraction"))
    np.testing.assert_allclose(a["mean"].to_numpy(), b["mean"].to_numpy(), rtol=1e-4)
