"""Drawing a mask: query tokens on the vertical axis, key tokens across."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._figure import new_axes, save_figure
from ..errors import MaskError
from .graph import MaskAnalysis, analyze
from .mask import Mask


def image_format(out: str | Path) -> str:
    """The matplotlib format of ``out``'s suffix (default ``png``); :class:`MaskError` if
    matplotlib cannot write it."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(out).suffix.lstrip(".").lower() or "png"
    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise MaskError(f"out {str(out)!r}: cannot write images of format {fmt!r}; "
                        f"use one of {', '.join(sorted(known))}")
    return fmt


def draw_mask(mask: Mask, analysis: MaskAnalysis | None = None, out: str | Path | None = None, *,
              ax: Any = None) -> Any:
    """Draw ``mask`` (dark cell ``(i, j)`` = query i attends to key j, centers in red); returns
    the figure, drawn on ``ax`` if given. ``analysis`` defaults to :func:`analyze` of ``mask``.
    ``out``: also write the image there (format from the suffix; :func:`image_format`)."""
    if out is not None:
        image_format(out)
    if analysis is None:
        analysis = analyze(mask)
    n = mask.n_tokens
    dense = mask.to_numpy()
    size = min(9.0, 3.0 + n / 16)
    fig, ax = new_axes(ax, figsize=(size, size))
    ax.imshow(dense, cmap="Greys", vmin=0, vmax=1.4, interpolation="nearest", origin="upper")
    centers = np.asarray(analysis.centers, dtype=int)
    if centers.size:
        ax.scatter(centers, np.full(centers.size, -0.5 - n * 0.02), marker="v", color="crimson",
                   s=18, clip_on=False, label="centers")
        ax.scatter(np.full(centers.size, -0.5 - n * 0.02), centers, marker=">", color="crimson",
                   s=18, clip_on=False)
        ax.legend(loc="lower left", bbox_to_anchor=(0.0, -0.14), frameon=False, fontsize=8)
    status = f"QSC, radius {analysis.radius}" if analysis.quasi_strongly_connected else "not QSC"
    if analysis.diameter is not None:
        status += f", diameter {analysis.diameter}"
    ax.set_title(f"{mask.spec}\nN = {n}; {status}", fontsize=9)
    ax.set(xlabel="key token j", ylabel="query token i  (M[i, j]: i attends to j)",
           xlim=(-0.5 - n * 0.04, n - 0.5), ylim=(n - 0.5, -0.5 - n * 0.04))
    fig.tight_layout()
    if out is not None:
        save_figure(fig, out, dpi=120)
    return fig
