"""Selections key on the full condition: every experiment alone and inside ``all`` gives
identical verdicts and numbers; plots and summaries keep two mask specs apart."""

import numpy as np
import pandas as pd
import pytest

from rankcollapse.experiments import ExecutionConfig, StorageConfig, plots, report, runner
from rankcollapse.experiments.config import EXPERIMENTS
from rankcollapse.experiments.table import rows_from_metrics

QUIET = ExecutionConfig(progress=False)
IN_MEMORY = StorageConfig(write=False)  # no output folder


def _key(c):
    return repr((c["verdict"], c["measured"], c["interval"], [(k["check"], k["value"], k["interval"], k["outcome"])
                                                             for k in c["checks"]]))


@pytest.mark.slow  # a whole run or fresh processes: CI runs it with the slow tests
def test_each_experiment_alone_equals_all(fake, all_smoke, tmp_path):
    together = {c["id"]: c for c in all_smoke.claims}
    seen = set()
    for name in EXPERIMENTS:
        alone = runner.run_experiment(name, "smoke", tmp_path / name, nearby=False,
                                      execution=QUIET, storage=IN_MEMORY).claims
        for c in alone:
            assert _key(c) == _key(together[c["id"]]), (name, c["id"])
            seen.add(c["id"])
    assert seen == set(together) and len(seen) == 36  # 12 + 4 N-axis (smoke) + G1-G5 + I1-I4 + L1-L5 + P1-P3 + E1-E2 + S1


def test_main_lists_only_claims_it_can_decide(fake, tmp_path):
    claims = runner.run_experiment("main", "smoke", tmp_path / "m", nearby=False,
                                   execution=QUIET, storage=IN_MEMORY).claims
    ids = [c["id"] for c in claims]
    # C03 needs norm-dropped probes, C11 orthogonal W_V: fig2's rows, not main's
    assert "C03" not in ids and "C11" not in ids and {"C01", "C02", "C04", "C05"} <= set(ids)
    # main runs the simulated control units of the claims it decides (the synthetic
    # executor does not label theory rows by check, so C02's theory controls are left out)
    assert all(c["controls"][k]["verdict"] != "not run" for c in claims if c["id"] in ("C01", "C04", "C05")
               for k in ("positive", "negative"))


def test_mask_override_names_missing_inputs(fake, tmp_path):
    res = runner.run_experiment("main", "smoke", tmp_path / "m", nearby=False,
                                overrides={"masks": ["sliding_window:w=3", "sliding_window:w=33"]},
                                execution=QUIET, storage=IN_MEMORY)
    c01 = next(c for c in res.claims if c["id"] == "C01")
    assert c01["verdict"] == "not run" and "mask_spec=sliding_window:w=9" in c01["missing"]


def _sim(spec, values):
    v = np.asarray(values, dtype=float)[:, None] * np.ones((1, 2))
    return rows_from_metrics({"mu_relative": v}, {"source": "simulate", "mask": spec.split(":")[0], "mask_spec": spec,
                                                  "variant": "pure", "value": "gaussian", "d_qk": 1.0, "init_scale": 1.0,
                                                  "sphere_radius": 1.0, "norm": "none", "depth": 2})


def test_plot_and_summary_keep_two_widths_apart():
    t = pd.concat([_sim("sliding_window:w=3", [1.0, 0.8, 0.53]), _sim("sliding_window:w=33", [1.0, 0.95, 0.89])],
                  ignore_index=True)
    spec = {"id": "p", "title": "t", "metric": "mu_relative", "lines": "mask", "select": {"source": "simulate"}}
    fig = plots.draw(t, spec)
    labels = fig.legends[0].get_texts()
    assert sorted(x.get_text() for x in labels) == ["sliding_window:w=3", "sliding_window:w=33"]
    assert plots.drawn_text(t, spec).startswith("source=simulate")
    html = str(report.summary_html(t))
    assert "<th>sliding_window:w=3</th><td>0.8 / 0.53</td>" in html
    assert "<th>sliding_window:w=33</th><td>0.95 / 0.89</td>" in html and "(t = 1)" in html


def test_log_floor_only_moves_values_at_or_below_zero():
    t = pd.concat([_sim("complete", [1.0, 5.8e-34, 0.0])], ignore_index=True)
    spec = {"id": "p", "title": "t", "metric": "mu_relative", "lines": "mask", "select": {"source": "simulate"}}
    fig = plots.draw(t, spec)
    ax = fig.axes[0]
    ys = np.concatenate([ln.get_ydata() for ln in ax.get_lines() if ln.get_label() == "complete"])
    assert 5.8e-34 in ys  # a tiny positive value is drawn where it is
    assert plots._log_floor(t) == pytest.approx(1e-35)
    assert any("values ≤ 0" in ln.get_label() for ln in ax.get_lines())
