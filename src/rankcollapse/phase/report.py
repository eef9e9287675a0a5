"""Write a phase table: ``phase.parquet``, regime heatmaps and ``report.html``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from .._display import fixed
from .._io import atomic_path, write_text_atomic
from .regime import REGIMES

PANELS_PER_FILE = 24
COLOURS = {"rank_collapse": "#d62728", "collapsing_slowly": "#9467bd", "uniform_attention": "#ff7f0e",
           "one_hot_attention": "#bcbd22", "aligned_without_consensus": "#e377c2", "stable_rank_k": "#2ca02c", "diverging": "#7f7f7f", "undecided": "#1f77b4"}
#: What a heatmap cell's colour and number mean (the legend's title).
CELL_TEXT = ("colour: regime;  number: log10(μ/‖X‖_F) at the last layer, geometric mean over trajectories "
             "(-300: at the 1e-300 floor)")


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def heatmaps(table: pd.DataFrame, axes: list[str], out: Path, plot: tuple[str, str] | None = None) -> list[Path]:
    """Regime heatmaps of ``table``: ``plot`` (default the first two varied axes) on each panel,
    one panel per combination of the other varied axes, :data:`PANELS_PER_FILE` per file;
    returns the files written."""
    from matplotlib.patches import Patch, Rectangle

    from .._figure import new_figure, save_figure

    varied = [a for a in axes if table[a].nunique() > 1] or axes[:1]
    if plot is None:
        plot = (varied[0], varied[1] if len(varied) > 1 else varied[0])
    xs, ys = list(dict.fromkeys(table[plot[0]])), list(dict.fromkeys(table[plot[1]]))
    rest = [a for a in varied if a not in plot]
    panels = [] if rest else [("", table)]  # one per combination of the other varied axes
    for key, sub in (table.groupby(rest, sort=False) if rest else []):
        key = key if isinstance(key, tuple) else (key,)
        panels.append((", ".join(f"{a}={_fmt(v)}" for a, v in zip(rest, key)), sub))
    files = []
    for f, start in enumerate(range(0, len(panels), PANELS_PER_FILE)):
        chunk = panels[start:start + PANELS_PER_FILE]
        ncol = min(4, len(chunk))
        nrow = math.ceil(len(chunk) / ncol)
        fig = new_figure((3.2 * ncol, 2.6 * nrow + 0.6))
        axs = fig.subplots(nrow, ncol, squeeze=False)
        for ax in axs.flat[len(chunk):]:
            ax.axis("off")
        for ax, (title, sub) in zip(axs.flat, chunk):
            for _, r in sub.iterrows():
                i, j = xs.index(r[plot[0]]), ys.index(r[plot[1]])
                ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, color=COLOURS[r["regime"]]))
                mu = r["mu_relative"]
                txt = "-inf" if mu == 0 else (fixed(math.log10(mu)) if mu == mu else "nan")
                ax.text(i, j, txt, ha="center", va="center", fontsize=6)
            ax.set(xlim=(-0.5, len(xs) - 0.5), ylim=(-0.5, len(ys) - 0.5))
            ax.set_xticks(range(len(xs)), [_fmt(x) for x in xs], fontsize=6, rotation=45)
            ax.set_yticks(range(len(ys)), [_fmt(y) for y in ys], fontsize=6)
            ax.set_xlabel(plot[0], fontsize=7)
            ax.set_ylabel(plot[1], fontsize=7)
            ax.set_title(title, fontsize=6)
        fig.legend(handles=[Patch(color=COLOURS[r], label=r) for r in REGIMES], loc="lower center", ncol=4, fontsize=7,
                   title=CELL_TEXT, title_fontsize=7)
        fig.tight_layout(rect=(0, 0.12, 1, 1))
        path = out / (f"heatmap_{f:03d}.png" if len(panels) > PANELS_PER_FILE else "heatmap.png")
        save_figure(fig, path, dpi=110)
        files.append(path)
    return files


_TEMPLATE = """<!doctype html><html><head><meta charset="utf-8"><title>rankcollapse phase</title>
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px}</style></head><body>
<h1>Phase diagram: {{ n_cells }} cells</h1>
<p>Fixed: {{ fixed }}. Samples per seed: {{ samples }}, seeds: {{ seeds }}, first seed {{ seed }}.
Computed {{ timing.computed }}, cached {{ timing.cached }}, wall {{ timing.wall_s }} s
({{ timing.executor }}, {{ timing.workers }} workers).</p>
<h2>Regimes</h2><table><tr><th>regime</th><th>cells</th></tr>
{% for r, n in regimes %}<tr><td>{{ r }}</td><td>{{ n }}</td></tr>{% endfor %}</table>
{% for n in notes %}<p>Note: {{ n }}.</p>{% endfor %}
<h2>Theory</h2><p>{{ theory }}</p>
{% for f in figures %}<p><img src="{{ f }}" style="max-width:100%"></p>{% endfor %}
<h2>Cells</h2>{{ cells_html }}
<p>Labelling rule: docs/phase.md.</p></body></html>"""


def operator_notes(table: pd.DataFrame) -> list[str]:
    """What μ/‖X‖_F does not show in ``table``'s cells: attention that is not row-stochastic, and
    one token above :data:`~rankcollapse.metrics.core.DOMINANT_SHARE` of ‖X‖_F² at the last layer."""
    from ..dynamics.operators import parse_attention
    from ..metrics.core import DOMINANT_SHARE

    notes = []
    if "attention" in table:
        other = table[[not parse_attention(a).row_stochastic for a in table["attention"]]]
        if len(other):
            notes.append(f"{len(other)} of {len(table)} cells run attention that is not row-stochastic "
                         f"({', '.join(sorted(set(other['attention'])))}): μ/‖X‖_F is scale-free: it shows neither "
                         "how the tokens' norms change (they may spread and decay to 0) nor one token taking over; read norm_spread, "
                         "max_token_share and row_mass_deficit beside it (phase.parquet, the report's cell table)")
    if "max_token_share" in table:
        share = table["max_token_share"]
        dominant = share[share > DOMINANT_SHARE]
        if len(dominant):
            notes.append(f"in {len(dominant)} of {len(table)} cells one token holds more than half of ‖X‖_F² at the "
                         f"last layer (median max_token_share over trajectories, up to {dominant.max():.3g}): there "
                         "μ/‖X‖_F mostly measures that token's norm (one non-zero token gives sqrt(1 − 1/N) whatever "
                         "the others), not how similar the other tokens are")
    return notes


#: Labels that say where a trajectory ended (collapsed, settled at rank k, aligned, diverged):
#: a prediction of another regime is contradicted by them.
END_STATES = ("rank_collapse", "stable_rank_k", "aligned_without_consensus", "diverging")
VERDICTS = ("agree", "disagree", "undecided")


def theory_verdict(row: Any) -> str:
    """``disagree``: a point above Theorem 1's envelope or an end state (:data:`END_STATES`)
    other than the predicted one; ``agree``: the predicted label, or ``collapsing_slowly``
    where ``rank_collapse`` is predicted; ``undecided`` otherwise; ``""`` without a
    prediction (docs/phase.md, "Theory's prediction per cell")."""
    pred, got = row["theory_regime"], row["regime"]
    if pred == "":
        return ""
    if float(row.get("envelope_violations", float("nan"))) > 0:  # NaN: no envelope for this cell
        return "disagree"
    if got == pred or (pred == "rank_collapse" and got == "collapsing_slowly"):
        return "agree"
    return "disagree" if got in END_STATES else "undecided"


def theory_agreement(table: pd.DataFrame) -> dict[str, Any]:
    """Over the predicted cells, overall and per ``theory_source``: ``n``, the fractions of
    each :func:`theory_verdict` (NaN without a predicted cell) and their ``counts``."""
    pred = table[table["theory_regime"] != ""]
    verdicts = pred.apply(theory_verdict, axis=1) if len(pred) else pd.Series([], dtype=object)

    def tally(v: pd.Series) -> dict[str, Any]:
        counts = {k: int((v == k).sum()) for k in VERDICTS}
        fractions = {k: counts[k] / len(v) if len(v) else float("nan") for k in VERDICTS}
        return {"n": int(len(v)), **fractions, "counts": counts}

    out = tally(verdicts)
    for src, sub in verdicts.groupby(pred["theory_source"]) if len(pred) else ():
        out[src] = tally(sub)
    return out


def write_report(table: pd.DataFrame, axes: list[str], out: Path, *, meta: dict[str, Any],
                 plot: tuple[str, str] | None = None) -> dict[str, Any]:
    """Write ``phase.parquet``, heatmaps and ``report.html`` under ``out``; returns the paths."""
    import jinja2

    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "phase.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    figs = heatmaps(table, axes, out, plot)
    counts = table["regime"].value_counts()
    html = jinja2.Template(_TEMPLATE, autoescape=True).render(
        n_cells=len(table), fixed=meta.get("fixed", {}), samples=meta.get("samples"), seeds=meta.get("seeds"),
        seed=meta.get("seed"), timing=meta.get("timing", {}),
        regimes=[(r, int(counts.get(r, 0))) for r in REGIMES], theory=theory_agreement(table),
        figures=[f.name for f in figs], notes=operator_notes(table),
        cells_html=jinja2.utils.markupsafe.Markup(table.head(2000).to_html(index=False, float_format=lambda v: f"{v + 0.0:.3g}")))
    write_text_atomic(out / "report.html", html)
    return {"parquet": str(out / "phase.parquet"), "heatmaps": [str(f) for f in figs], "report": str(out / "report.html")}


__all__ = ["heatmaps", "theory_agreement", "theory_verdict", "write_report"]
