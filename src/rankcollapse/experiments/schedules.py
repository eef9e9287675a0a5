"""The schedule study (``configs/schedules.yaml``, docs/schedules.md): collapse rate of
mask schedules at equal attention budget (:func:`~rankcollapse.theory.compare_schedules`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from .._io import atomic_path, write_text_atomic
from .._outdir import check_out, writing
from ..errors import ConfigError
from ..masks.schedule import parse_schedule
from ..dynamics.config import RunConfig
from ..theory.rates import compare_schedules
from .config import SAFE_LOADER
from .schema import validate_study


def _read_study() -> Any:
    """The parsed ``configs/schedules.yaml``."""
    text = resources.files(__package__).joinpath("configs", "schedules.yaml").read_text("utf-8")
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a SafeLoader


def load_study(scale: str = "quick") -> dict[str, Any]:
    """``configs/schedules.yaml``, validated, with the ``scale`` overrides applied; :class:`ConfigError` for an
    unknown scale or a study file that fails validation (naming the key)."""
    cfg = _read_study()
    validate_study(cfg, "schedules")
    if scale not in cfg["scales"]:
        raise ConfigError(f"unknown scale {scale!r}; choose from {sorted(cfg['scales'])}")
    over = dict(cfg["scales"][scale])
    if "budget_widths" in over:
        cfg["budget_widths"] = over.pop("budget_widths")
    cfg["simulation"] = {**cfg["simulation"], **over}
    cfg["scale"] = scale
    return cfg


def window_for_budget(template: str, n_tokens: int, budget: float) -> tuple[int, str, float]:
    """``(w, spec, mean edges)`` of the width whose schedule ``template.format(w=w)`` has
    mean edges per layer closest to ``budget`` (ties: the smaller ``w``)."""
    best = None
    for w in range(1, n_tokens + 1):
        spec = template.format(w=w)
        spec = spec if spec.startswith("schedule:") else "schedule:" + spec
        e = parse_schedule(spec, n_tokens).mean_edges()
        if best is None or abs(e - budget) < abs(best[2] - budget):
            best = (w, spec, e)
    return best


#: The files the study writes into its output folder.
NAMES = ("schedules.csv", "schedules.json", "schedules.png")


def run_schedule_study(out: Path, scale: str = "quick", seed: int = 0, *, allow_nonempty: bool = False) -> pd.DataFrame:
    """Run the study, write ``schedules.csv/.json/.png`` into ``out`` and return the table
    (:func:`compare_schedules`' columns plus ``family, width, budget``).

    Raises
    ------
    ConfigError, UnsafePathError
        ``out`` is refused (:func:`rankcollapse._outdir.check_out`), before any work.
    """
    out = Path(out)
    check_out(out, NAMES, allow_nonempty=allow_nonempty)
    cfg = load_study(scale)
    n, sim = int(cfg["n_tokens"]), cfg["simulation"]
    frames = []
    for bw in cfg["budget_widths"]:
        budget = parse_schedule(f"causal_sliding_window:w={bw}", n).mean_edges()
        picks = {fam: window_for_budget(t, n, budget) for fam, t in cfg["families"].items()}
        # a family that cannot meet the budget (e.g. 1 local : 1 global below N(N+1)/4) is left out
        picks = {f: p for f, p in picks.items() if abs(p[2] - budget) <= cfg["budget_tolerance"] * budget}
        df = compare_schedules([p[1] for p in picks.values()], n, measure=RunConfig(depth=sim["depth"], seed=seed),
                               d_model=sim["d_model"], n_samples=sim["n_samples"], d_qk=sim["d_qk"])
        df.insert(0, "family", list(picks))
        df.insert(1, "width", [p[0] for p in picks.values()])
        df.insert(2, "budget", budget)
        frames.append(df)
    table = pd.concat(frames, ignore_index=True)
    with writing(out, f"schedules {scale} seed {seed}\n", NAMES, allow_nonempty=allow_nonempty, flags=False) as stage:
        with atomic_path(stage / "schedules.csv") as tmp:
            table.to_csv(tmp, index=False)
        rows = json.loads(table.to_json(orient="records"))
        write_text_atomic(stage / "schedules.json", json.dumps({"config": cfg, "seed": seed, "rows": rows}, indent=1))
        plot_study(table, stage / "schedules.png", cfg)
    return table


def plot_study(table: pd.DataFrame, path: Path | None, cfg: dict[str, Any]) -> Any:
    """Measured per-layer factor of μ and the envelope's log10 layers per 10x against the
    budget, one line per family; written to ``path`` unless None; returns the figure."""
    from .._figure import new_figure, save_figure

    fig = new_figure((10, 4))
    a, b = fig.subplots(1, 2)
    for fam, g in table.groupby("family", sort=False):
        a.errorbar(g["budget"], g["measured_rate"], yerr=[g["measured_rate"] - g["measured_q25"],
                   g["measured_q75"] - g["measured_rate"]], fmt="o-", capsize=3, label=fam)
        b.plot(g["budget"], g["log10_layers_per_decade"], "o-", label=fam)
    sim = cfg["simulation"]
    a.set(xlabel="attended pairs per layer (mean over the period)", ylabel="measured per-layer factor of μ",
          title=f"measured (N={cfg['n_tokens']}, d={sim['d_model']}, {sim['n_samples']} samples)")
    b.set(xlabel="attended pairs per layer (mean over the period)", ylabel="log10 layers per 10x (envelope)",
          title="predicted: (1-ε^e)^{t/e}, e = min(p r_H, L)")
    a.legend(fontsize=8)
    fig.suptitle(cfg["title"], fontsize=10)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path, dpi=110)
    return fig
