"""Plots of probe tables: per-layer metrics of one or several models in one figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import ConfigError

#: Default panels: ``(metric, title)``.
PLOT_METRICS = (("mu", "μ(X)"), ("rank_fraction", "rank fraction"), ("sigma_min", "σ_min"), ("avg_abs_cos", "avg |cos|"))


def drawn_metrics(tables: Mapping[str, Any]) -> list[str]:
    """The metrics of ``tables`` (in table order) with rows at the points :func:`plot_layers`
    draws (:func:`_layer_rows`)."""
    out: dict[str, None] = {}
    for t in tables.values():
        blocks, final = _layer_rows(t)
        out.update(dict.fromkeys(list(blocks["metric"]) + list(final["metric"])))
    return list(out)


def _panels(tables: Mapping[str, Any], metrics: Sequence[str] | None) -> list[tuple[str, str]]:
    """``(metric, title)`` per panel; :class:`ConfigError` for a metric without drawn rows."""
    titles = dict(PLOT_METRICS)
    held = drawn_metrics(tables)
    if metrics is None:  # the default panels the tables hold, else every metric they hold
        metrics = [m for m, _ in PLOT_METRICS if m in held] or held
    missing = [m for m in metrics if m not in held]
    if missing or not metrics:
        raise ConfigError(f"plot_layers: metrics {missing or list(metrics)} have no rows at the points the figure "
                          f"draws (embeddings, layer.k.output, layer.k.attention, final_norm); those points hold "
                          f"{', '.join(held) or 'none'}")
    return [(m, titles.get(m, m)) for m in metrics]


def plot_layers(tables: Mapping[str, Any] | Any, path: str | Path | None = None, *, ax: Any = None,
                metrics: Sequence[str] | None = None) -> Any:
    """Per-layer curves of :func:`rankcollapse.models.probe` tables, one line per model
    through the embeddings and block outputs (T5: the encoder's), a final norm as a star.

    ``tables``: ``{label: table}`` or one table; ``path``: also write the figure there (by
    the suffix); ``ax``: axes, one per metric (else a new pyplot-free figure); ``metrics``:
    one panel each, default those of :data:`PLOT_METRICS` held, else all (μ on a log scale).
    Returns the figure, titled with each table's intervention settings.

    Raises
    ------
    ConfigError
        No table, ``ax`` of another length than the metrics, or a metric no table holds.
    """
    from .._figure import new_figure, save_figure

    if not isinstance(tables, Mapping):
        tables = {str(getattr(tables, "attrs", {}).get("model") or "model"): tables}
    if not tables:
        raise ConfigError("plot_layers needs at least one probe table")
    panels = _panels(tables, metrics)
    if ax is None:
        fig = new_figure((4 * len(panels), 3.9))
        axes = list(fig.subplots(1, len(panels), squeeze=False)[0])
    else:
        axes = list(ax)
        if len(axes) != len(panels):
            raise ConfigError(f"plot_layers draws {len(panels)} panels; ax= gave {len(axes)} axes")
        fig = axes[0].figure
    for name, table in tables.items():
        blocks, final = _layer_rows(table)
        for ax, (metric, label) in zip(axes, panels):
            rows = blocks[blocks["metric"] == metric].sort_values("layer")
            if len(rows):
                line = ax.plot(rows["layer"], rows["mean"], marker="o", ms=3, label=f"{name} (block outputs)")[0]
                ax.fill_between(rows["layer"], rows["q05"], rows["q95"], alpha=0.15, color=line.get_color())
                fin = final[final["metric"] == metric]
                if len(fin):
                    ax.plot(fin["layer"], fin["mean"], linestyle="none", marker="*", ms=11, mfc="none",
                            color=line.get_color(), label=f"{name} final_norm")
            ax.set_xlabel("layer (hidden_states index)")
            ax.set_title(label)
    for ax, (metric, _) in zip(axes, panels):
        if metric == "mu":
            ax.set_yscale("log")
    legend: dict[str, Any] = {}  # every panel's lines: a model may have no rows in the first panel
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    axes[0].legend(list(legend.values()), list(legend), fontsize=7)
    fig.suptitle(_settings_title(tables), fontsize=10)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path, dpi=110)
    return fig


def _settings_title(tables: dict[str, Any]) -> str:
    parts = []
    for name, table in tables.items():
        a = table.attrs
        drop = ",".join(a.get("drop") or []) or "none"
        parts.append(f"{name}: mask={a.get('mask') or 'model default'}, d_qk_scale={a.get('d_qk_scale', 1.0):g}, drop={drop}")
    return "; ".join(parts)


def _layer_rows(table: Any) -> tuple[Any, Any]:
    """``(blocks, final)``: rows of embeddings and layer.k.output|attention; rows of final_norm (T5: encoder's)."""
    pts = table["point"].str.replace(r"^(encoder|decoder)\.", "", regex=True)
    encoder_only = ~table["point"].str.startswith("decoder.")
    blocks = table[encoder_only & (pts.eq("embeddings") | pts.str.fullmatch(r"layer\.\d+\.(output|attention)"))]
    return blocks, table[encoder_only & pts.eq("final_norm")]


__all__ = ["PLOT_METRICS", "drawn_metrics", "plot_layers"]
