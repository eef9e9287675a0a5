"""Importing the package and drawing never change matplotlib's backend, pyplot's open
figures, or the process environment; plotting functions draw on a caller's ax and
return the figure."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch


def test_plotting_functions_draw_on_given_ax():
    from matplotlib.figure import Figure

    from rankcollapse import dynamics, masks, theory
    from rankcollapse.models import plot_layers

    fig = Figure()
    ax = fig.add_subplot()
    assert masks.draw_mask(masks.parse_mask("causal", 6), ax=ax) is fig
    assert len(ax.images) == 1
    assert np.array_equal(ax.images[0].get_array(), masks.parse_mask("causal", 6).to_numpy())

    fig2 = Figure()
    ax2 = fig2.add_subplot()
    res = dynamics.simulate(dynamics.gaussian_tokens(2, 4, 3, seed=0), mask="causal", run=dynamics.RunConfig(depth=4))
    assert res.plot(ax=ax2) is fig2
    mu_line = ax2.lines[0]
    assert np.allclose(mu_line.get_ydata(), res.metrics["mu"].mean(1).numpy()[1:])

    data = theory.portrait_2d_data(n_angles=5, depth=3)
    fig3 = Figure()
    ax3 = fig3.add_subplot()
    assert theory.plot_portrait_2d(data, ax=ax3) is fig3
    fig4 = Figure()
    ax4 = fig4.add_subplot(projection="3d")
    traj = theory.trajectories_3d(n_starts=2, depth=3)
    assert theory.plot_trajectories_3d(traj, ax=ax4) is fig4

    import pandas as pd
    table = pd.DataFrame({"layer": [0, 1], "point": ["embeddings", "layer.0.output"], "metric": "mu",
                          "mean": [1.0, 0.5], "q05": [0.9, 0.4], "q95": [1.1, 0.6]})
    fig5 = Figure()
    axes = fig5.subplots(1, 4)
    with pytest.raises(Exception):
        plot_layers({"m": table}, ax=axes[:2])


def _phase_table():
    import pandas as pd

    rows = []
    for norm in ("none", "layernorm"):
        for s in (0.1, 1.0, 10.0):
            for mask, radius in (("causal", 7), ("sliding", 2)):
                regime = "rank_collapse" if (s >= 1.0 and norm == "none") or (s == 10.0 and mask == "causal") else "stable_rank_k"
                rows.append({"norm": norm, "alpha": 1.0, "placement": "pre_ln", "qk_scale": s, "mask": mask, "radius": radius,
                             "regime": regime, "mu_relative": 10.0 ** -s})
    return pd.DataFrame(rows)


def test_imports_and_draws_leave_backend_figures_and_environment_alone(tmp_path):
    # one fresh interpreter whose backend (svg) is chosen before anything of ours is
    # imported: the package and its drawing functions, then every module of the package,
    # then the plots that write files (phase heatmaps, phase findings, the schedules study)
    code = textwrap.dedent(f"""
        import importlib, os, pkgutil, matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
        import pandas as pd
        from pathlib import Path
        env = dict(os.environ)
        import rankcollapse, rankcollapse.experiments.plots, rankcollapse.sweep.context
        import rankcollapse.experiments.runner, rankcollapse.masks.graph, rankcollapse.theory.basin
        from rankcollapse import masks, theory, dynamics
        fig = masks.draw_mask(masks.parse_mask("causal", 8))
        masks.draw_mask(masks.parse_mask("causal", 8), out={str(tmp_path / 'm.png')!r})
        theory.portrait_2d(n_angles=9, depth=5)
        res = dynamics.simulate(dynamics.gaussian_tokens(2, 4, 3, seed=0), mask="causal", run=dynamics.RunConfig(depth=3))
        res.plot()
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert plt.get_fignums() == [], plt.get_fignums()
        assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
        names = [m.name for m in pkgutil.walk_packages(rankcollapse.__path__, "rankcollapse.")]
        for name in names:
            importlib.import_module(name)
            assert matplotlib.get_backend() == "svg", (name, matplotlib.get_backend())
        from rankcollapse.phase.report import heatmaps
        from rankcollapse.phase.findings import boundary_figure, regime_figure
        from rankcollapse.experiments.schedules import plot_study
        out = Path({str(tmp_path)!r})
        table = pd.read_json({str(tmp_path / 'phase.json')!r})
        files = heatmaps(table, ["norm", "qk_scale", "mask"], out)
        boundary_figure(table, "mask", out / "boundary.png", "t")
        regime_figure(table, out / "regimes.png")
        study = pd.DataFrame({{"family": ["a", "a", "b"], "budget": [1.0, 2.0, 1.5],
                              "measured_rate": [0.5, 0.4, 0.6], "measured_q25": [0.45, 0.35, 0.55],
                              "measured_q75": [0.55, 0.45, 0.65], "log10_layers_per_decade": [1.0, 0.8, 1.2]}})
        plot_study(study, out / "schedules.png", {{"n_tokens": 8, "title": "t",
                                                 "simulation": {{"d_model": 4, "n_samples": 2}}}})
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert plt.get_fignums() == [], plt.get_fignums()
        assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
        print(len(names), len(files))
    """)
    _phase_table().to_json(tmp_path / "phase.json")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "MPLBACKEND")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    n_modules, n_heatmaps = map(int, done.stdout.split())
    assert n_modules > 50 and n_heatmaps == 1
    assert (tmp_path / "m.png").stat().st_size > 0
    for name in ("heatmap.png", "boundary.png", "regimes.png", "schedules.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_phase_figures_draw_on_given_ax_and_return_the_figure():
    from matplotlib.figure import Figure

    from rankcollapse.phase.findings import boundary_figure, regime_figure

    table = _phase_table()
    fig = Figure()
    ax = fig.add_subplot()
    assert boundary_figure(table, "norm", None, "t", ax=ax) is fig
    # one line per norm: the fraction of rank_collapse cells at each qk_scale
    expected = table.assign(c=table["regime"] == "rank_collapse").groupby(["norm", "qk_scale"])["c"].mean()
    assert [line.get_label() for line in ax.lines] == ["norm=layernorm", "norm=none"]
    for line, norm in zip(ax.lines, ("layernorm", "none")):
        assert np.allclose(line.get_xdata(), [0.1, 1.0, 10.0])
        assert np.allclose(line.get_ydata(), expected[norm].to_numpy())
    fig2 = regime_figure(table, None)
    assert isinstance(fig2, Figure) and len([a for a in fig2.axes if a.patches]) == 2
