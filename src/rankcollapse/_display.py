"""Results in a notebook: ``to_pandas()`` (a tidy table) and ``_repr_html_`` (scalar facts, first rows)."""

from __future__ import annotations

import html
import math
from typing import Any

_HEAD_ROWS = 12


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _fmt(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.4e}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def fixed(value: float, spec: str = ".0f") -> str:
    """``value`` in the fixed-point format ``spec`` (``".0f"``, ``"+.3f"``), never a negative zero
    (``-0.1`` at ``.0f`` gives ``0``)."""
    text = format(value, spec)
    if text.startswith("-") and float(text) == 0:
        return format(0.0, spec)
    return text


class NotebookResult:
    """Mixin: ``to_pandas()`` and ``_repr_html_`` from ``to_dict()``."""

    def to_pandas(self) -> Any:
        """One-row :class:`pandas.DataFrame` of the scalar entries of ``to_dict()``."""
        import pandas as pd

        facts = self._facts()
        return pd.DataFrame([facts], columns=list(facts))

    def _facts(self) -> dict[str, Any]:
        """Scalar entries of ``to_dict()`` (lists of scalars shortened to text)."""
        out: dict[str, Any] = {}
        for k, v in self.to_dict().items():  # type: ignore[attr-defined]
            if _is_scalar(v):
                out[k] = v
            elif isinstance(v, (list, tuple)) and len(v) <= 16 and all(_is_scalar(x) for x in v):
                out[k] = ", ".join(_fmt(x) for x in v) if v else "—"
        return out

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>"
                       for k, v in self._facts().items())
        parts = [f"<b>{html.escape(type(self).__name__)}</b>", f"<table>{rows}</table>"]
        table = self.to_pandas()
        if len(table) > 1:
            parts.append(f"<p>to_pandas(): {len(table)} rows x {table.shape[1]} columns; first {_HEAD_ROWS}:</p>")
            parts.append(table.head(_HEAD_ROWS).to_html(index=False, float_format=_fmt))
        return "\n".join(parts)
