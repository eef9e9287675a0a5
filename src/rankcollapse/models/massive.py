"""The ``clip_massive`` intervention (docs/models.md, "Trained-model geometry"): at the
first block output where a window's max / median real-token norm reaches
:data:`MASSIVE_RATIO`, its largest token is scaled to the median norm (direction kept),
once per window and forward pass; :class:`MassiveClip` reports what follows.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from .edits import _replace
from .families import Stack
from .geometry_story import MASSIVE_RATIO
from .recorder import _pick

#: Per-window fields of :attr:`MassiveClip.found` and of ``probe(...).attrs["massive_clips"]``.
CLIP_FIELDS = ("block", "token", "ratio", "ratio_after", "returns_at", "returns_token")


def _largest(X: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per window of ``X`` ``(B, N, d)`` over its ``real`` tokens, ``(B,)`` float64 each:
    max/median token norm (NaN where the median is 0), the largest token's position, its
    norm and the median."""
    norms = X.detach().double().norm(dim=-1)  # (B, N)
    median = torch.nanquantile(torch.where(real, norms, torch.nan), 0.5, dim=-1)
    top, where = torch.where(real, norms, -1.0).max(dim=-1)
    return torch.where(median > 0, top / median, torch.nan), where, top, median


class MassiveClip:
    """Forward hooks clipping the massive token of each window of one stack.

    Attributes
    ----------
    found : dict[str, torch.Tensor] or None
        After a forward pass, per window ``(B,)`` (-1 or NaN where it does not apply):
        ``block`` clipped (-1: none), ``token``, ``ratio`` before and ``ratio_after`` the
        clip, ``returns_at`` (first later block whose output is massive again) and
        ``returns_token`` (its largest token there).
    """

    def __init__(self, stack: Stack, padding: torch.Tensor, ratio: float = MASSIVE_RATIO):
        self.blocks = {id(p.block): p.block for p in stack.blocks}
        self.prefix = stack.prefix
        self.padding = padding.bool()
        self.ratio = ratio
        self.calls = 0
        self.found: dict[str, torch.Tensor] | None = None

    def reset(self, *_: Any, **__: Any) -> None:
        self.calls = 0
        self.found = None

    def hook(self, module: nn.Module, args: tuple, output: Any) -> Any:
        X = _pick(output, 0)
        block, self.calls = self.calls, self.calls + 1
        real = self.padding.to(X.device)
        if self.found is None:  # ratios NaN, blocks and tokens -1
            self.found = {k: torch.full((X.shape[0],), torch.nan, dtype=torch.float64) if k.startswith("ratio")
                          else torch.full((X.shape[0],), -1, dtype=torch.int64) for k in CLIP_FIELDS}
        f = self.found
        ratio, where, top, median = (t.cpu() for t in _largest(X, real))
        massive = ratio >= self.ratio  # NaN compares False
        back = massive & (f["block"] >= 0) & (f["returns_at"] < 0)
        f["returns_at"][back], f["returns_token"][back] = block, where[back]
        clip = massive & (f["block"] < 0)
        if not bool(clip.any()):
            return None
        f["block"][clip], f["token"][clip], f["ratio"][clip] = block, where[clip], ratio[clip]
        b = torch.nonzero(clip).flatten().to(X.device)
        w = where.to(X.device)[b]
        X = X.clone()
        X[b, w] = X[b, w] * (median / top).to(device=X.device, dtype=X.dtype)[b].unsqueeze(-1)
        f["ratio_after"][clip] = _largest(X, real)[0].cpu()[clip]
        return _replace(output, 0, X)

    def records(self, first_window: int = 0) -> list[dict[str, Any]]:
        """One dict per clipped window of the latest forward pass: ``window`` (counted from
        ``first_window``), ``point``, ``returns_point`` and :data:`CLIP_FIELDS`."""
        f = self.found
        if f is None:
            return []
        out = []
        for b in torch.nonzero(f["block"] >= 0).flatten().tolist():
            row = {k: (int(f[k][b]) if f[k].dtype == torch.int64 else float(f[k][b])) for k in CLIP_FIELDS}
            back = row["returns_at"]
            out.append({"window": first_window + b, "point": f"{self.prefix}layer.{row['block']}.output",
                        "returns_point": f"{self.prefix}layer.{back}.output" if back >= 0 else None, **row})
        return out

    def install(self, model: nn.Module) -> list[Any]:
        """Register the hooks (a reset on the model, the clip on every block); returns the handles."""
        handles = [model.register_forward_pre_hook(self.reset)]
        handles.extend(b.register_forward_hook(self.hook) for b in self.blocks.values())
        return handles


def clip_report(records: list[dict[str, Any]], n_samples: int, ratio: float = MASSIVE_RATIO) -> str:
    """One line on where ``clip_massive`` clipped and what followed, from the records of
    ``probe(...).attrs["massive_clips"]``: windows clipped of ``n_samples``, block outputs
    and tokens, the ratio left after the clip, and the windows massive again later."""
    if not records:
        return f"clip-massive: no window had a token with max/median norm >= {ratio:g}; nothing clipped"

    def counts(key: str, rows: list[dict[str, Any]]) -> str:
        c = Counter(r[key] for r in rows)
        return ", ".join(f"{k} ({v})" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], str(kv[0]))))

    after = max(r["ratio_after"] for r in records)
    back = [r for r in records if r["returns_at"] >= 0]
    same = sum(r["returns_token"] == r["token"] for r in back)
    line = (f"clip-massive: clipped {len(records)} of {n_samples} windows at {counts('point', records)}, "
            f"token {counts('token', records)}; max/median norm there {min(r['ratio'] for r in records):.3g}-"
            f"{max(r['ratio'] for r in records):.3g} before the clip, at most {after:.3g} after it"
            f"{' (a second massive token)' if after >= ratio else ''}; ")
    if not back:
        return line + "no later block output is massive again"
    return line + (f"massive again in {len(back)} windows, first at {counts('returns_point', back)}: the same token "
                   f"rebuilt in {same}, another token in {len(back) - same}")
