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


def test_import_and_draw_leave_backend_and_environment_alone(tmp_path):
    # a fresh interpreter: the backend is chosen before anything of ours is imported
    code = textwrap.dedent(f"""
        import os, matplotlib
        matplotlib.use("svg")
        import matplotlib.pyplot as plt
        env = dict(os.environ)
        import rankcollapse, rankcollapse.experiments.plots, rankcollapse.experiments.context
        import rankcollapse.experiments.runner, rankcollapse.masks.plot, rankcollapse.theory.portrait
        from rankcollapse import masks, theory, dynamics
        fig = masks.draw_mask(masks.parse_mask("causal", 8))
        masks.draw_mask(masks.parse_mask("causal", 8), out={str(tmp_path / 'm.png')!r})
        theory.portrait_2d(n_angles=9, depth=5)
        res = dynamics.simulate(dynamics.gaussian_tokens(2, 4, 3, seed=0), mask="causal", depth=3)
        res.plot()
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert plt.get_fignums() == [], plt.get_fignums()
        assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "MPLBACKEND")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
    assert (tmp_path / "m.png").stat().st_size > 0


def test_plotting_functions_draw_on_given_ax():
    from matplotlib.figure import Figure

    from rankcollapse import dynamics, masks, theory
    from rankcollapse.cli.probe import plot_layers

    fig = Figure()
    ax = fig.add_subplot()
    assert masks.draw_mask(masks.parse_mask("causal", 6), ax=ax) is fig
    assert len(ax.images) == 1
    assert np.array_equal(ax.images[0].get_array(), masks.parse_mask("causal", 6).to_numpy())

    fig2 = Figure()
    ax2 = fig2.add_subplot()
    res = dynamics.simulate(dynamics.gaussian_tokens(2, 4, 3, seed=0), mask="causal", depth=4)
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
