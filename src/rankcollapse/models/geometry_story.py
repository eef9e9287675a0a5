"""Words and a figure, computed from per-layer means, for what a probe's geometry
metrics show (``probe --out``: ``geometry.md``, ``geometry.png``; the reproduce report).
No layer or number is named in advance: the layer described is the first whose mean
``max_norm_ratio`` reaches :data:`MASSIVE_RATIO`, and every number is read from the curves.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

#: A token counts as massive from this ratio to the median token norm on (the claims' G1 threshold).
MASSIVE_RATIO = 10.0
_SINKS = ("sink_mass", "sink_head_fraction", "sink_value_ratio", "sink_contribution")


def layer_curves(table: pd.DataFrame) -> pd.DataFrame:
    """Per-layer means ``(layers, metrics)`` of one probe table: hidden states
    (``embeddings``, ``*.output``) and per-block sink rows (``*.attention``)."""
    pts = table["point"].astype(str)
    hidden = (pts == "embeddings") | pts.str.endswith(".output")
    sink = table["metric"].isin(_SINKS) & pts.str.endswith(".attention")
    rows = table[(hidden & ~table["metric"].isin(_SINKS)) | sink]
    return rows.pivot_table(index="layer", columns="metric", values="mean", aggfunc="mean").sort_index()


def _at(c: pd.DataFrame, metric: str, layer: int) -> float:
    return float(c.at[layer, metric]) if metric in c and layer in c.index else math.nan


def _g(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3g}"


def _move(a: float, b: float) -> str:
    return "rises" if b > a else "falls" if b < a else "stays"


def _spans(layers: list[int]) -> str:
    out, start = [], None
    for i, l in enumerate(layers):
        start = l if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != l + 1:
            out.append(f"{start}" if start == l else f"{start}-{l}")
            start = None
    return ", ".join(out)


#: A max / median token norm within this of 1 at every layer: all tokens have one norm.
EQUAL_NORMS_TOL = 1e-3
#: Why a random-init post-LN control has every token at one norm.
_FORCED = "post-LN: an untrained LayerNorm, weight 1 and bias 0, ends every block and puts every token at norm √d"


def forced_equal_norms(ratio: pd.Series) -> bool:
    """Whether ``max_norm_ratio`` is 1 (within :data:`EQUAL_NORMS_TOL`) at every layer, as an
    untrained LayerNorm at every block output forces."""
    return len(ratio) > 0 and bool(((ratio - 1).abs() <= EQUAL_NORMS_TOL).all())


def forced_control_notes(tables: Mapping[str, Any]) -> dict[str, str]:
    """``{name: note}`` for each random-init control among ``tables`` whose
    ``max_norm_ratio`` is forced to 1 by its construction (:func:`forced_equal_norms`)."""
    out = {}
    for name, t in tables.items():
        if ("[random-init" in name and (t["metric"] == "max_norm_ratio").any()
                and forced_equal_norms(layer_curves(t)["max_norm_ratio"].dropna())):
            out[name] = (f"{name}: max_norm_ratio is 1 at every layer by construction ({_FORCED}); it says nothing "
                         "about what training does to the norms")
    return out


def first_massive_layer(c: pd.DataFrame) -> int | None:
    """The first layer whose mean ``max_norm_ratio`` is at least :data:`MASSIVE_RATIO` (None: none)."""
    if "max_norm_ratio" not in c:
        return None
    hit = c.index[c["max_norm_ratio"] >= MASSIVE_RATIO]
    return int(hit[0]) if len(hit) else None


def explain(name: str, trained: pd.DataFrame, control: pd.DataFrame | None = None,
            clipped: pd.DataFrame | None = None) -> list[str]:
    """Sentences describing ``trained``'s curves (:func:`layer_curves`), beside its
    ``control`` and ``clipped`` run when given; empty without ``max_norm_ratio``."""
    if "max_norm_ratio" not in trained:
        return []
    L = first_massive_layer(trained)
    r = trained["max_norm_ratio"]
    if L is None:
        lines = [f"{name}: no layer has a token {MASSIVE_RATIO:g}x the median token norm (largest ratio "
                 f"{_g(r.max())} at layer {int(r.idxmax())})."]
    else:
        prev = int(trained.index[trained.index < L].max()) if (trained.index < L).any() else L
        pos = _at(trained, "max_norm_position", L)
        where = ("the first token in every window" if pos == 0 else
                 f"at mean position {_g(pos)}" if math.isfinite(pos) else "")
        massive = [int(x) for x in trained.index[r >= MASSIVE_RATIO]]
        lines = [f"{name}: at layer {L} the largest token norm reaches {_g(r[L])}x the median (layer {prev}: "
                 f"{_g(r[prev])}x)" + (f", {where}" if where else "") + f"; {len(massive)} of {len(r)} layers "
                 f"have a token at least {MASSIVE_RATIO:g}x the median (layers {_spans(massive)})."]
        share, own = _at(trained, "top_singular_share", L), _at(trained, "max_token_sigma_share", L)
        if math.isfinite(share):
            lines.append(f"There the top singular direction holds {_g(share)} of ‖X‖_F² (layer {prev}: "
                         f"{_g(_at(trained, 'top_singular_share', prev))}) and the largest token alone gives "
                         f"{_g(own)} of σ₁²" + (": the top direction is that token." if own >= 0.9 else "."))
        parts = []
        for metric, label in (("matrix_entropy", "matrix entropy (nats)"), ("effective_rank", "effective rank"),
                              ("mu_relative", "μ/‖X‖_F")):
            a, b = _at(trained, metric, prev), _at(trained, metric, L)
            if math.isfinite(a) and math.isfinite(b):
                parts.append(f"{label} {_move(a, b)} from {_g(a)} to {_g(b)}")
        if parts:
            lines.append(f"From layer {prev} to {L}: " + "; ".join(parts) + ".")
        if "sink_mass" in trained:
            s = trained["sink_mass"].dropna()
            before, after = s[s.index < L], s[s.index > L]
            lines.append(f"Attention on the first token (sink_mass, mean over queries and heads) is {_g(_at(trained, 'sink_mass', L))} "
                         f"in block {L}, against a mean of {_g(before.mean())} in the blocks before it and "
                         f"{_g(after.mean())} after it.")
    if control is not None and "max_norm_ratio" in control:
        rc = control["max_norm_ratio"].dropna()
        if forced_equal_norms(rc):
            text = ("Random-init control of the same architecture: max / median token norm 1 at every layer, forced "
                    f"by its construction ({_FORCED}), so it says nothing about what training does to the norms")
        else:
            text = (f"Random-init control of the same architecture: largest ratio {_g(rc.max())} "
                    f"(layer {int(rc.idxmax())})" + (", never a massive token" if rc.max() < MASSIVE_RATIO else ""))
        if "sink_mass" in control:
            sc = control["sink_mass"].dropna()
            text += f"; first-token attention {_g(sc.min())}-{_g(sc.max())} over its blocks"
        if "mu_relative" in control:
            m = control["mu_relative"].dropna()
            text += f"; μ/‖X‖_F {_move(m.iloc[0], m.iloc[-1])} from {_g(m.iloc[0])} to {_g(m.iloc[-1])}"
        lines.append(text + ".")
    if clipped is not None and "effective_rank" in clipped and "effective_rank" in trained:
        a, b = trained["effective_rank"].min(), clipped["effective_rank"].min()
        lines.append(f"With the massive token clipped to the median norm (--clip-massive) the smallest effective "
                     f"rank over layers is {_g(b)} against {_g(a)} unclipped ({_g(b / a)}x); largest ratio "
                     f"{_g(clipped['max_norm_ratio'].max())}.")
    return lines


def plot_geometry(curves: Mapping[str, pd.DataFrame], path: str | Path) -> Path:
    """:func:`geometry_figure` written atomically as a PNG; returns its path."""
    from .._figure import save_figure

    return save_figure(geometry_figure(curves), path, dpi=110)


def geometry_figure(curves: Mapping[str, pd.DataFrame]) -> Any:
    """Max / median token norm per layer (log scale) and, when measured, ``sink_mass``:
    one panel per metric, one line per curve (a random-init control dashed); pyplot-free."""
    from .._figure import new_figure

    panels = [(metric, kw) for metric, kw in (
        ("max_norm_ratio", dict(yscale="log", xlabel="layer", ylabel="max ‖x_i‖ / median ‖x_i‖",
                                title="largest token norm vs the median")),
        ("sink_mass", dict(xlabel="block", ylabel="attention on the first token", title="attention sink mass",
                           ylim=(0, 1))))
        if any(metric in c and c[metric].notna().any() for c in curves.values())]
    fig = new_figure((5.5 * max(len(panels), 1), 4))
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    for ax, (metric, kw) in zip(axes, panels):
        for label, c in curves.items():
            if metric in c:
                s = c[metric].dropna()
                style = "--" if "random-init" in label or "random_init" in label else "-"
                ax.plot(s.index, s.values, style, marker=".", label=label)
        if metric == "max_norm_ratio":
            ax.axhline(MASSIVE_RATIO, color="grey", lw=0.8, ls=":")
        ax.set(**kw)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def from_results_table(table: pd.DataFrame) -> tuple[list[str], dict[str, pd.DataFrame]]:
    """Sentences and curves of every probed model of a ``reproduce`` table: the trained full
    model, its ``random_init`` control and its ``full_clip_massive`` run."""
    rows = table[(table["source"] == "probe") & (table.get("setting", "default") == "default")]
    lines: list[str] = []
    curves: dict[str, pd.DataFrame] = {}
    for model in sorted(rows["model"].unique()):
        m = rows[rows["model"] == model]

        def pick(value: str, variant: str) -> pd.DataFrame | None:
            sub = m[(m["value"] == value) & (m["variant"] == variant)]
            return layer_curves(sub) if not sub.empty else None

        trained = pick("pretrained", "full")
        if trained is None or "max_norm_ratio" not in trained:
            continue
        control, clipped = pick("random_init", "full"), pick("pretrained", "full_clip_massive")
        lines += explain(model, trained, control, clipped)
        curves[f"{model} trained"] = trained
        for label, c in ((f"{model} random-init", control), (f"{model} clip-massive", clipped)):
            if c is not None:
                curves[label] = c
    return lines, curves


def from_probe_tables(tables: Mapping[str, Any]) -> tuple[list[str], dict[str, pd.DataFrame]]:
    """Sentences and curves of ``probe`` tables keyed by model name (``NAME [random-init,
    seed S]`` is the control of ``NAME``)."""
    curves = {name: layer_curves(t) for name, t in tables.items()}
    lines: list[str] = []
    for name, t in tables.items():
        if "[random-init" in name:
            continue
        control = next((c for n, c in curves.items() if n.startswith(f"{name} [random-init")), None)
        label = name + (" (--clip-massive)" if t.attrs.get("clip_massive") else "")
        lines += explain(label, curves[name], control)
    return lines, curves
