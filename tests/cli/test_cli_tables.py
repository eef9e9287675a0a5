"""Terminal tables print every label as written: rich reads ``[...]`` as markup, so a
control's label ``[random-init, seed 0]`` would otherwise vanish from the table."""

import pandas as pd

from rankcollapse.cli._output import make_table, print_table


def test_a_label_in_brackets_is_printed_literally(capsys):
    print_table(make_table("run [bold]x[/bold]", ["model [m]", "mu"], [["tiny [random-init, seed 0]", "[red]1[/]"]]))
    out = capsys.readouterr().out
    for text in ("run [bold]x[/bold]", "model [m]", "tiny [random-init, seed 0]", "[red]1[/]"):
        assert text in out


def test_probe_table_tells_the_trained_model_from_its_control(capsys):
    from rankcollapse.cli.probe import _print_summary

    def table(model):
        t = pd.DataFrame({"layer": [0, 1], "point": ["embeddings", "layer.0.output"], "metric": "mu",
                          "mean": [1.0, 0.5]})
        t.attrs.update(model=model, family="bert", n_samples=2)
        return t

    _print_summary(table("tiny"), table("tiny [random-init, seed 0]"))
    out = capsys.readouterr().out
    assert "tiny [random-init, seed 0] (bert)" in out  # the title
    rows = [line for line in out.splitlines() if "layer.0.output" in line]
    assert len(rows) == 2 and sum("[random-init, seed 0]" in line for line in rows) == 1
