"""Real MiniLM (all-MiniLM-L6-v2) on a user text file through the real CLI entry point:
the JSON numbers equal metrics computed from the model's own hidden_states."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rankcollapse.data import Windows, make_windows, read_text_file
from rankcollapse.metrics import compute_metrics
from rankcollapse.models import load_model

WORDS = "the river city was built near old stone bridge where people trade grain wool and salt every year".split()


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("text") / "docs.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS, 60)) for _ in range(20)) + "\n", encoding="utf-8")
    return path


def _main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """The real entry point in-process (same error mapping as the console script)."""
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr().err


def test_probe_json_matches_hidden_states(monkeypatch, capsys, text_file, tmp_path):
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", "--model", "minilm", "--text-file", str(text_file), "--n-samples", "4",
                                      "--n-tokens", "48", "--format", "json", "--out", str(tmp_path / "run")])
    main()
    doc = json.loads(capsys.readouterr().out)  # stdout holds exactly one JSON document
    assert doc["model"] == "minilm" and doc["n_samples"] == 4 and len(doc["layers"]) == 7
    assert [e["layer"] for e in doc["layers"]] == list(range(7))
    assert doc["layers"][0]["point"] == "embeddings" and doc["layers"][6]["point"] == "layer.5.output"

    loaded = load_model("minilm")
    wins = make_windows(read_text_file(text_file), loaded.tokenizer, n_tokens=48, n_samples=4, seed=0)
    saved = Windows.load(tmp_path / "run" / "windows.npz")
    assert torch.equal(saved.input_ids, wins.input_ids) and saved.input_ids.shape == (4, 48)
    with torch.no_grad():
        hs = loaded.model(input_ids=wins.input_ids, attention_mask=wins.attention_mask, output_hidden_states=True).hidden_states
    for entry, h in zip(doc["layers"], hs):
        direct = compute_metrics(h, ["mu", "sigma_min"], padding_mask=wins.attention_mask.bool(), dtype=torch.float64)
        for metric in ("mu", "sigma_min"):
            np.testing.assert_allclose(entry[metric], direct[metric].mean().item(), rtol=1e-4)
        assert {"mu_relative", "rank_fraction", "avg_abs_cos"} <= set(entry)
    for name in ("probe.csv", "probe.png", "probe.json"):
        assert (tmp_path / "run" / name).stat().st_size > 0


@pytest.mark.parametrize(
    "content, extra, text",
    [
        (b"", [], "no text"),
        (b"\xff\xfe bad bytes\n", [], "UTF-8"),
        (b"just a few words\n", [], "fewer than one window"),
        (None, ["--mask", "causal_sliding_window:w=0"], "w"),
        (None, ["--drop", "attention"], "attention"),
        (None, ["--d-qk", "-1"], "--d-qk"),
    ],
)
def test_bad_input_one_line_exit_2(monkeypatch, capsys, tmp_path, text_file, content, extra, text):
    path = text_file
    if content is not None:
        path = tmp_path / "bad.txt"
        path.write_bytes(content)
    code, err = _main(monkeypatch, capsys, "--model", "minilm", "--text-file", str(path), "--n-samples", "2", "--n-tokens", "32", *extra)
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("rankcollapse: error:")]
    assert len(lines) == 1 and text in lines[0], err


def test_mask_file_of_wrong_size(monkeypatch, capsys, tmp_path, text_file):
    mask_path = tmp_path / "m.npy"
    np.save(mask_path, np.tril(np.ones((20, 20), dtype=bool)))
    code, err = _main(monkeypatch, capsys, "--model", "minilm", "--text-file", str(text_file), "--n-tokens", "32",
                      "--mask", f"file:{mask_path}")
    assert code == 2 and "rankcollapse: error:" in err and "32" in err


def test_hub_name_offline_fails_fast(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = _main(monkeypatch, capsys, "--model", "some-org/not-a-local-model", "--n-samples", "2", "--n-tokens", "16")
    assert code == 2
    assert "some-org/not-a-local-model" in err and "HF_HUB_OFFLINE" in err


@pytest.mark.parametrize(
    "extra, text",
    [
        (["--drop", "final_norm"], "final norm"),
        (["--drop", "skip:3-1"], "3-1"),
        (["--gguf-file", "x.gguf"], "gguf"),
    ],
)
def test_unsupported_options_for_minilm_exit_2(monkeypatch, capsys, text_file, extra, text):
    code, err = _main(monkeypatch, capsys, "--model", "minilm", "--text-file", str(text_file), "--n-samples", "2", "--n-tokens", "32", *extra)
    lines = [ln for ln in err.splitlines() if ln.startswith("rankcollapse: error:")]
    assert code == 2 and len(lines) == 1 and text in lines[0], err


def test_local_folder_without_config_names_what_is_missing(monkeypatch, capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model", encoding="utf-8")
    code, err = _main(monkeypatch, capsys, "--model", str(tmp_path), "--n-samples", "2", "--n-tokens", "16")
    assert code == 2 and "config.json" in err and str(tmp_path) in err, err
    code, err = _main(monkeypatch, capsys, "--model", str(tmp_path / "notes.txt"), "--n-samples", "2", "--n-tokens", "16")
    assert code == 2 and "not a folder" in err, err
