"""The ``clip_massive`` intervention: remove a massive token from the residual stream.

Trained language models put one token (usually the first) at a norm tens to thousands
of times the others' at one block and keep it there (Sun et al., "Massive Activations
in Large Language Models", 2024). To ask what that token does to the geometry, the
intervention scales its row down to the median token norm at the layer where it
appears, and lets the model run on:

- **massive**: at a block's output (the residual stream ``hidden_states[k + 1]`` in a
  pre-LN model), a window whose real tokens have ``max_i ||x_i|| / median_i ||x_i|| >=``
  :data:`MASSIVE_RATIO` (``max_norm_ratio`` of :mod:`rankcollapse.metrics.geometry`,
  numpy's median over the window's real tokens).
- **clip**: at the *first* block where a window is massive, its largest-norm real token
  ``x_i`` becomes ``x_i · median / ||x_i||`` (direction kept). Each window is clipped
  once per forward pass; later blocks see the clipped stream and may rebuild the token
  (the probe then still shows it).
- **report**: per clipped window, the block and token, the ratio before and after the
  clip at that block output (still >= 10 after it: a second massive token), and the
  first later block output that is massive again and its largest token (the clipped
  one: rebuilt; another: a new massive token) (:class:`MassiveClip`,
  :func:`clip_report`). A block's output point is recorded after its clip; the points
  inside that block (its norms and sublayer outputs, the same ``layer``) before it.

Why 10: inside a window, token norms of ordinary tokens stay within a few times the
median (the norms and the residual average them), while a massive token is a single
outlier 100x and more (SmolLM2 above layer 12, measured with ``probe``); 10 separates the
two by an order of magnitude on both sides and was fixed before any measurement here.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from .families import Stack

MASSIVE_RATIO = 10.0


#: Per-window fields of :attr:`MassiveClip.found` and of ``probe(...).attrs["massive_clips"]``.
CLIP_FIELDS = ("block", "token", "ratio", "ratio_after", "returns_at", "returns_token")


def _pick(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _replace(output: Any, value: torch.Tensor) -> Any:
    return (value,) + output[1:] if isinstance(output, tuple) else value


def _largest(X: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per window of ``X`` ``(B, N, d)`` over its real tokens (``real`` bool ``(B, N)``):
    max/median token norm, the largest token's position, its norm and the median, ``(B,)``
    each (float64; the ratio is NaN where the median is 0)."""
    norms = X.detach().double().norm(dim=-1)  # (B, N)
    median = torch.nanquantile(torch.where(real, norms, torch.nan), 0.5, dim=-1)
    top, where = torch.where(real, norms, -1.0).max(dim=-1)
    return torch.where(median > 0, top / median, torch.nan), where, top, median


class MassiveClip:
    """Forward hooks clipping the massive token of each window of one stack, and saying
    what the model does after the clip.

    Attributes
    ----------
    found : dict[str, torch.Tensor] or None
        After a forward pass, per window ``(B,)`` (:data:`CLIP_FIELDS`; -1 or NaN where
        it does not apply): ``block``, the block (0-based) whose output was clipped (-1:
        no block's output was massive); ``token``, the clipped position; ``ratio``,
        max/median token norm there before the clip; ``ratio_after``, the same after it
        (>= :data:`MASSIVE_RATIO`: a second massive token in that block's output);
        ``returns_at``, the first later block whose output is massive again (-1: none);
        ``returns_token``, its largest token there (equal to ``token``: the model
        rebuilt the clipped token; otherwise another token became massive).
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
        X = _pick(output)
        block, self.calls = self.calls, self.calls + 1
        real = self.padding.to(X.device)
        if self.found is None:
            self.found = {k: torch.full((X.shape[0],), -1, dtype=torch.int64) if k in ("block", "token", "returns_at",
                          "returns_token") else torch.full((X.shape[0],), torch.nan, dtype=torch.float64)
                          for k in CLIP_FIELDS}
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
        return _replace(output, X)

    def records(self, first_window: int = 0) -> list[dict[str, Any]]:
        """One dict per clipped window of the latest forward pass: ``window`` (its row,
        counted from ``first_window``), ``point`` (the clipped block output,
        ``{prefix}layer.k.output``), ``returns_point`` (None where it does not return)
        and :data:`CLIP_FIELDS`."""
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
        """Register the hooks (a reset on the model's forward, the clip on every block);
        returns their handles."""
        handles = [model.register_forward_pre_hook(self.reset)]
        handles.extend(b.register_forward_hook(self.hook) for b in self.blocks.values())
        return handles


def clip_report(records: list[dict[str, Any]], n_samples: int, ratio: float = MASSIVE_RATIO) -> str:
    """One line on where ``clip_massive`` clipped and what followed, from the per-window
    records of ``probe(...).attrs["massive_clips"]`` (``window``, ``point``, ``returns_point``
    and :data:`CLIP_FIELDS`, one per clipped window).

    Says in how many of ``n_samples`` windows a token was clipped, at which block output
    and token position (counts), the largest max/median norm left in that output after the
    clip (>= ``ratio``: a second massive token there), and in how many windows a later
    block's output is massive again, by the same token (rebuilt) or another.
    """
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
