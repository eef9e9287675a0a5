"""Words about massive tokens and sinks are computed from the curves: the layer named
is the first whose max_norm_ratio reaches 10, and every number follows the table."""

import pandas as pd

from rankcollapse.models.geometry_story import (
    MASSIVE_RATIO, explain, first_massive_layer, from_probe_tables, from_results_table, layer_curves, plot_geometry,
    geometry_figure,
)


def _probe_table(jump_at: int, n_layers: int = 6, sink: float = 0.5) -> pd.DataFrame:
    rows = []
    for layer in range(n_layers + 1):
        point = "embeddings" if layer == 0 else f"layer.{layer - 1}.output"
        big = layer >= jump_at
        for metric, value in (("max_norm_ratio", 150.0 if big else 2.0), ("max_norm_position", 0.0),
                              ("top_singular_share", 0.99 if big else 0.3), ("max_token_sigma_share", 0.999 if big else 0.1),
                              ("matrix_entropy", 0.1 if big else 3.0), ("effective_rank", 8.0 if big else 80.0)):
            rows.append({"layer": layer, "point": point, "metric": metric, "mean": value})
        if layer:
            rows.append({"layer": layer, "point": f"layer.{layer - 1}.attention", "metric": "sink_mass",
                         "mean": sink if big else 0.05})
            rows.append({"layer": layer, "point": f"layer.{layer - 1}.attention.head_0", "metric": "sink_mass", "mean": 9.0})
    rows.append({"layer": n_layers, "point": "final_norm", "metric": "max_norm_ratio", "mean": 1e6})
    return pd.DataFrame(rows)


def test_the_layer_and_numbers_come_from_the_curves():
    for jump in (3, 5):
        c = layer_curves(_probe_table(jump))
        assert first_massive_layer(c) == jump and c["sink_mass"].max() == 0.5  # per-head and final-norm rows left out
        text = " ".join(explain("m", c))
        assert f"at layer {jump} the largest token norm reaches 150x the median (layer {jump - 1}: 2x)" in text
        assert "the first token in every window" in text and "the top direction is that token" in text
        assert f"From layer {jump - 1} to {jump}: matrix entropy (nats) falls from 3 to 0.1" in text
        assert f"effective rank falls from 80 to 8" in text and f"is 0.5 in block {jump}" in text
    none = " ".join(explain("m", layer_curves(_probe_table(99))))
    assert f"no layer has a token {MASSIVE_RATIO:g}x the median" in none and "largest ratio 2 at layer 0" in none


def test_control_and_clip_sentences(tmp_path):
    trained, control = _probe_table(3), _probe_table(99, sink=0.05)
    lines, curves = from_probe_tables({"m": trained, "m [random-init, seed 0]": control})
    assert len(curves) == 2 and any("Random-init control" in x and "never a massive token" in x for x in lines)
    table = pd.concat([trained.assign(value="pretrained", variant="full"),
                       control.assign(value="random_init", variant="full"),
                       _probe_table(99).assign(value="pretrained", variant="full_clip_massive")])
    table = table.assign(source="probe", model="m", setting="default")
    lines, curves = from_results_table(table)
    assert any("smallest effective rank over layers is 80 against 8 unclipped (10x)" in x for x in lines)
    assert set(curves) == {"m trained", "m random-init", "m clip-massive"}
    assert plot_geometry(curves, tmp_path / "g.png").stat().st_size > 0


def test_geometry_figure_has_a_panel_per_measured_metric_only(recwarn):
    """Without sink_mass no empty "attention sink mass" panel, and no legend warning."""
    no_sink = _probe_table(3)
    no_sink = no_sink[no_sink["metric"] != "sink_mass"]
    fig = geometry_figure({"m": layer_curves(no_sink), "m [random-init, seed 0]": layer_curves(_probe_table(99))
                           .drop(columns="sink_mass")})
    assert [ax.get_title() for ax in fig.axes] == ["largest token norm vs the median"]
    assert not [w for w in recwarn if "legend" in str(w.message).lower() or "artists" in str(w.message)]
    both = geometry_figure({"m": layer_curves(_probe_table(3))})
    assert [ax.get_title() for ax in both.axes] == ["largest token norm vs the median", "attention sink mass"]
    assert all(ax.get_legend() is not None for ax in both.axes)


def test_a_control_whose_equal_norms_are_forced_by_layernorm_says_so():
    """An untrained post-LN model puts every token at norm √d: its max / median ratio is 1
    at every layer by construction, which the text says instead of "never a massive token"."""
    flat = _probe_table(99)
    flat.loc[flat["metric"] == "max_norm_ratio", "mean"] = 1.0 + 1e-7
    text = " ".join(explain("m", layer_curves(_probe_table(3)), layer_curves(flat)))
    assert "forced by its construction" in text and "never a massive token" not in text
    varied = " ".join(explain("m", layer_curves(_probe_table(3)), layer_curves(_probe_table(99))))
    assert "largest ratio 2" in varied and "never a massive token" in varied and "forced" not in varied


def test_probe_notes_a_control_whose_norm_ratio_is_forced():
    from rankcollapse.models.geometry_story import forced_control_notes

    flat = _probe_table(99)
    flat.loc[flat["metric"] == "max_norm_ratio", "mean"] = 1.0
    notes = forced_control_notes({"m": _probe_table(3), "m [random-init, seed 0]": flat,
                                  "n [random-init, seed 0]": _probe_table(99)})
    assert list(notes) == ["m [random-init, seed 0]"] and "by construction" in notes["m [random-init, seed 0]"]
