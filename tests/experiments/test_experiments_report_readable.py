"""The main report reads in a minute: sphere_radius named as such, one colour per mask
across panels, a mask x condition summary grid with the shared fields said once,
captions without fields that do not apply, and a note where one token dominates ‖X‖_F."""

import numpy as np
import pandas as pd
import pytest
import torch

from rankcollapse.experiments import digest, plots
from rankcollapse.experiments.table import normalise, rows_from_metrics
from rankcollapse.metrics import compute_metrics

MASKS = ("complete", "causal", "sliding_window:w=9", "causal_sliding_window:w=9")
#: main's simulated conditions: (variant, norm, sphere_radius)
CONDITIONS = (("pure", "none", 1.0), ("sphere", "sphere", 1.0), ("sphere", "sphere", 19.6), ("layernorm", "layernorm", 1.0),
              ("skip", "none", 1.0), ("post_ln", "layernorm", 1.0))
SPEC = {"id": "sim", "title": "t", "metric": "mu_relative", "panels": "variant", "lines": "mask", "loglog": True,
        "select": {"source": "simulate"}}


def _sim(mask, variant, norm, sphere_radius, depth=8, start=1.0, rate=0.5, dtype="float64"):
    v = start * rate ** np.arange(depth + 1, dtype=float)[:, None] * np.ones((1, 3))
    return rows_from_metrics({"mu_relative": v}, {
        "source": "simulate", "model": "minilm", "mask": mask.split(":")[0], "mask_spec": mask, "variant": variant,
        "norm": norm, "sphere_radius": sphere_radius, "value": "gaussian", "init_scale": 1.0, "d_qk": 1.0,
        "depth": depth, "dtype": dtype})


@pytest.fixture(scope="module")
def main_like():
    return pd.concat([_sim(m, *c, rate=0.5 + 0.01 * i) for i, m in enumerate(MASKS) for c in CONDITIONS], ignore_index=True)


def test_legend_names_the_sphere_radius_and_a_mask_keeps_its_colour(main_like):
    fig = plots.draw(main_like, SPEC)
    colours: dict[str, set] = {}
    labels = set()
    for ax in fig.axes:
        for ln in ax.get_lines():
            lab = ln.get_label()
            if lab.startswith("_") or "≤ 0" in lab:
                continue
            labels.add(lab)
            colours.setdefault(lab.split(" · ")[0], set()).add(tuple(np.round(ln.get_color(), 6)))
    assert "complete · sphere_radius=19.6" in labels and "complete · sphere_radius=1" in labels
    assert not any("radius=" in lab.replace("sphere_radius=", "") for lab in labels)
    assert not any("norm=" in lab for lab in labels)  # norm changes with the panel only: the title says it
    assert set(colours) == set(MASKS) and all(len(c) == 1 for c in colours.values())  # one colour per mask
    assert len({next(iter(c)) for c in colours.values()}) == len(MASKS)


def test_caption_leaves_out_fields_that_do_not_apply():
    probe = normalise(pd.DataFrame({"layer": [0, 1], "metric": "mu_relative", "mean": [0.5, 0.4], "source": "probe",
                                    "variant": "full", "value": "pretrained", "model": "minilm"}))
    text = plots.drawn_text(probe, {"metric": "mu_relative", "lines": "model", "select": {"source": "probe"}})
    assert text == "source=probe, model=minilm, variant=full, value=pretrained"


def test_summary_is_a_mask_by_condition_grid_with_shared_fields_once(main_like):
    grid, shared, usual, depths = digest.summary_grid(main_like)
    assert grid.shape == (4, 6) and list(grid.index) == list(MASKS)
    assert list(grid.columns) == ["pure", "sphere", "sphere · sphere_radius=19.6", "layernorm", "skip", "post_ln"]
    assert shared == ["source=simulate", "model=minilm", "value=gaussian", "init_scale=1", "d_qk=1", "depth=8"]
    assert usual == ["sphere_radius=1"] and depths == (4, 8)
    cell = grid.loc["causal", "skip"]  # rate 0.51: 0.51^4 at the claim depth, 0.51^8 at 2x
    assert cell.at_depth == pytest.approx(0.51 ** 4) and cell.at_2x == pytest.approx(0.51 ** 8)
    html = str(digest.summary_html(main_like))
    assert html.count("<tr>") == 5 and html.count("source=simulate") == 1


def test_summary_marks_values_at_the_floor_of_their_dtype():
    """The floor is the round-off model 2 (N + d) eps at the rows' N (the run's) and d
    (MiniLM's 384): 2.27e-13 at N = 128, so 1e-13 is at it though above eps."""
    t = pd.concat([_sim("complete", "pure", "none", 1.0, rate=1e-3), _sim("causal", "pure", "none", 1.0, rate=0.9),
                   _sim("sliding_window:w=9", "pure", "none", 1.0, rate=1e-13 ** (1 / 8))], ignore_index=True)
    grid, *_ = digest.summary_grid(t, n_tokens=128)
    assert grid.shape == (3, 1)
    assert digest.cell_text(grid.loc["complete"].iloc[0]) == "1e-12 / 1e-24*"  # 1e-12 > 2.27e-13 > 1e-24
    assert digest.cell_text(grid.loc["sliding_window:w=9"].iloc[0]).endswith("/ 1e-13*")
    assert "*" not in digest.cell_text(grid.loc["causal"].iloc[0])
    assert "float64 2.27e-13" in str(digest.summary_html(t, n_tokens=128))


def test_summary_at_2x_reads_the_windows_the_last_layer_holds():
    """Layers beyond D = 4 on the first 2 of 4 windows (inputs 1, 1, 3, 3): the 2x cell
    divides by the input of those 2 windows, the claim-depth cell by that of all 4."""
    labels = {"source": "simulate", "model": "minilm", "mask": "complete", "mask_spec": "complete", "variant": "pure",
              "depth": 8, "dtype": "float64"}
    v = np.array([1.0, 1.0, 3.0, 3.0]) * np.array([0.5, 0.5, 0.9, 0.9]) ** np.arange(9, dtype=float)[:, None]
    t = pd.concat([rows_from_metrics({"mu_relative": v[:5]}, labels),
                   rows_from_metrics({"mu_relative": v[5:, :2]}, labels, layers=[5, 6, 7, 8])], ignore_index=True)
    cell = digest.summary_grid(t)[0].iloc[0, 0]
    assert cell.at_depth == pytest.approx((2 * 0.5 ** 4 + 6 * 0.9 ** 4) / 8) and cell.at_2x == pytest.approx(0.5 ** 8)


def test_results_table_says_on_how_many_windows_2x_depth_was_read():
    from rankcollapse.experiments.report import results_json, results_markdown

    claim = {"id": "C1", "effect": "e", "verdict": "reproduced", "measured": 2.0, "interval": [1.5, 2.5],
             "n_samples": 3000, "depth_check": {"depth": 128, "verdict": "reproduced", "measured": 2.1,
                                                "interval": [1.4, 2.9], "n_samples": 256}}
    assert "| reproduced (on 256 windows) |" in results_markdown([claim])
    assert results_json([claim])[0]["depth_check"]["n_samples"] == 256
    every = {**claim, "depth_check": {**claim["depth_check"], "n_samples": 3000}}
    assert "| reproduced |" in results_markdown([every]) and "windows" not in results_markdown([every])


def _probe_rows(model, X_layers):
    """Probe rows of the real metrics on per-layer token matrices ``(L, B, N, d)``."""
    vals = {m: torch.stack([compute_metrics(torch.as_tensor(X), [m])[m] for X in X_layers]) for m in
            ("mu", "mu_relative", "max_token_share")}
    return rows_from_metrics(vals, {"source": "probe", "model": model, "variant": "full", "value": "pretrained",
                                    "mask": "causal", "mask_spec": "causal"})


def test_a_layer_where_one_token_dominates_is_noted_and_only_then():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((4, 3, 32, 16))  # 4 layers, 3 windows, N = 32
    big = X.copy()
    big[2:, :, 0, :] *= 100.0  # from layer 2, token 0's norm explodes (share ~ 0.997)
    t = pd.concat([_probe_rows("spiky", big), _probe_rows("plain", X)], ignore_index=True)
    notes = digest.dominant_token_notes(t)
    assert len(notes) == 1 and notes[0].startswith("source=probe model=spiky mask_spec=causal variant=full: from layer 2 on")
    assert "in 3 of 3 windows" in notes[0] and "2 of 4 layers" in notes[0]
    mu_rel = t[(t["model"] == "spiky") & (t["metric"] == "mu_relative")].set_index("layer")["mean"]
    assert f"μ/‖X‖_F {mu_rel[1]:.3g} → {mu_rel[2]:.3g}" in notes[0] and mu_rel[2] > 0.98  # sqrt(1 - 1/32) = 0.984
