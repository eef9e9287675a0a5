"""Figures without pyplot: a plot draws on the caller's ``ax`` or a new unregistered
:class:`matplotlib.figure.Figure` and returns it; pyplot state and backend are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._io import atomic_path


def new_axes(ax: Any = None, *, figsize: tuple[float, float] = (6.0, 4.0), **subplot_kw: Any) -> tuple[Any, Any]:
    """``(figure, axes)``: ``ax`` and its figure when given, else a new pyplot-free figure."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(figsize)
    return fig, fig.add_subplot(**subplot_kw)


def new_figure(figsize: tuple[float, float]) -> Any:
    """A new pyplot-free :class:`~matplotlib.figure.Figure`."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def save_figure(fig: Any, path: str | Path, *, dpi: int = 120, **kwargs: Any) -> Path:
    """Write ``fig`` atomically to ``path``; the format follows the suffix (png by default)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=dpi, **kwargs)
    return path


def colour(i: int, name: str = "tab10") -> tuple[float, float, float, float]:
    """Colour ``i`` of the qualitative colormap ``name`` (no pyplot needed)."""
    import matplotlib

    cmap = matplotlib.colormaps[name]
    return cmap(i % cmap.N)
