"""Refusals are one line and early, and nothing a run cannot apply is silently ignored:
the bad inputs of each kind, run in-process (tests/cli/_harness.py)."""

from __future__ import annotations

import json
import warnings

import pytest

from rankcollapse.errors import ConfigError, MaskError, MetricError, RankCollapseError
from tests.cli._harness import check_run, invoke


def _refused(argv, root, *texts):
    code, out, err = check_run(argv, root)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    for text in texts:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, text", [
    (["simulate", "--mask", "causal", "--attention", "sink:b=2,b=3", "--depth", "2", "--n-tokens", "4",
      "--d-model", "2"], "key 'b' given twice"),
    (["simulate", "--mask", "sliding_window:w=3,w=5", "--depth", "2", "--n-tokens", "4", "--d-model", "2"],
     "key 'w' given twice"),
    (["simulate", "--model", "minilm", "--depth", "3", "--out", "o"],  # refused before the model loads
     "--depth does not apply with --model"),
    (["theory", "clusters", "--beta", "4,1e308"], "beta must be <= 1e+150"),
    (["theory", "clusters", "--beta", "1e-308"], "beta must be >= 1e-150"),
    (["theory", "clusters", "--angle", "4"], "angle must be <= 3.14159"),
    (["theory", "basin", "--system", "twice.json"], "gives the key 'W_V' twice"),
    (["reproduce", "influence", "--scale", "smoke", "--n-tokens", "100000", "--out", "o"],
     "--n-tokens does not apply to influence at scale smoke"),
    (["reproduce", "influence", "--scale", "smoke", "--text-file", "docs.txt", "--out", "o"],
     "--text-file does not apply to influence at scale smoke"),
    (["reproduce", "geometry", "--scale", "smoke", "--mask", "causal", "--out", "o"],
     "--mask does not apply to geometry at scale smoke"),
])
def test_bad_values_are_one_line_and_exit_2(tmp_path, argv, text):
    (tmp_path / "docs.txt").write_text("a text file\n")
    (tmp_path / "twice.json").write_text('{"mask": "causal", "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], '
                                         '"W_V": [[1, 0], [0, 1]], "W_V": [[2, 0], [0, 2]]}')
    _refused(argv, tmp_path, text)  # nothing left behind (check_run)


def test_metrics_mask_without_a_graph_metric_is_refused(tmp_path):
    import numpy as np

    np.save(tmp_path / "X.npy", np.arange(12.0).reshape(4, 3) ** 2)
    _refused(["metrics", "X.npy", "--mask", "causal", "--metrics", "mu,avg_cos"], tmp_path,
             "--mask applies to the metrics on the mask's graph (dirichlet_energy, mean_average_distance); "
             "none of --metrics mu,avg_cos uses it")
    code, out, _ = check_run(["metrics", "X.npy", "--mask", "causal", "--metrics", "mu,dirichlet_energy",
                              "--format", "json"], tmp_path)
    rows = np.arange(12.0).reshape(4, 3) ** 2  # causal: (1/N) sum over i >= j of ||x_i - x_j||^2
    expect = sum(((rows[i] - rows[j]) ** 2).sum() for i in range(4) for j in range(i)) / 4
    assert code == 0 and json.loads(out)["dirichlet_energy"] == pytest.approx(expect, rel=1e-12)


def test_phase_cell_whose_trajectories_all_diverge_is_a_result_not_an_internal_error(tmp_path):
    # every trajectory overflows: the cell has no decay law to fit; it is 'undecided'
    code, out, err = invoke(["phase", "--axis", "value_scale=1e300", "--depth", "4", "--n-tokens", "4",
                             "--d-model", "2", "--n-samples", "1", "--out", "ph", "--format", "json"], tmp_path)
    assert code == 0, err
    (cell,) = json.loads(out)["cells"]
    assert cell["frac_diverging"] == 1.0 and cell["regime"] == "diverging"
    assert cell["law"] == "undecided" and cell["law_rate"] is None


def test_influence_with_a_slope_past_float64_is_silent_and_exact(tmp_path):
    # exp(-m d) is 0 for every d >= 1 once m > 745: each query keeps only itself
    for spec in ("causal", "longformer:w=3,globals=0"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            code, out, err = invoke(["mask", "influence", spec, "--n-tokens", "6", "--depth", "2", "--alpha", "0.5",
                                     "--decay", "1e308", "--format", "json"], tmp_path)
        assert code == 0 and err == "", err
        assert json.loads(out)["influence"] == [0.0] * 5 + [1.0]


def test_api_errors_are_rank_collapse_errors(tmp_path):
    from rankcollapse.masks.influence import draw_influence
    from rankcollapse.phase.grid import parse_axis

    with pytest.raises(ConfigError, match="expects a string"):
        parse_axis(None)
    with pytest.raises(MaskError, match="draws the Influence"):
        draw_influence(None)
    from rankcollapse.models import default_points, detect_family
    from rankcollapse.errors import ModelError
    from rankcollapse.phase import expand_grid

    with pytest.raises(ConfigError, match="axes and fixed must be dicts"):
        expand_grid(None)
    for call in (lambda: detect_family(None), lambda: default_points(None)):
        with pytest.raises(ModelError):
            call()



def test_windows_past_the_models_positions_are_refused_before_the_text_is_cut(tmp_path):
    """``probe --text-file short.txt --n-tokens 100`` on a model of 64 positions, in a fresh process:
    stderr is the one error line, no warning first that the short text gives fewer windows than asked."""
    import os
    import subprocess
    import sys

    import torch
    import transformers as tf

    from rankcollapse import assets

    tok = tf.AutoTokenizer.from_pretrained(assets.minilm_dir())
    torch.manual_seed(0)
    folder = tmp_path / "tiny64"
    tf.BertModel(tf.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=64)).save_pretrained(folder)
    tok.save_pretrained(folder)
    (tmp_path / "short.txt").write_text(" ".join(["The quick brown fox jumps over the lazy dog."] * 70) + "\n")
    out = subprocess.run([sys.executable, "-c", "from rankcollapse.cli import main; main()", "probe", "--model",
                          str(folder), "--text-file", "short.txt", "--n-tokens", "100"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [f"rankcollapse: error: windows of 100 tokens exceed {folder}'s 64 positions; "
                                       "use windows of at most 64 tokens"]
