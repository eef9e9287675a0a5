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

Why 10: inside a window, token norms of ordinary tokens stay within a few times the
median (the norms and the residual average them), while a massive token is a single
outlier 100x and more (SmolLM2 above layer 12, measured with ``probe``); 10 separates the
two by an order of magnitude on both sides and was fixed before any measurement here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .families import Stack

MASSIVE_RATIO = 10.0


def _pick(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _replace(output: Any, value: torch.Tensor) -> Any:
    return (value,) + output[1:] if isinstance(output, tuple) else value


class MassiveClip:
    """Forward hooks clipping the massive token of each window of one stack.

    Attributes
    ----------
    clipped_at : torch.Tensor or None
        After a forward pass: ``(B,)`` int64, the block (0-based) whose output was clipped
        in each window, -1 where no block's output was massive.
    """

    def __init__(self, stack: Stack, padding: torch.Tensor, ratio: float = MASSIVE_RATIO):
        self.blocks = {id(p.block): p.block for p in stack.blocks}
        self.padding = padding.bool()
        self.ratio = ratio
        self.calls = 0
        self.clipped_at: torch.Tensor | None = None

    def reset(self, *_: Any, **__: Any) -> None:
        self.calls = 0
        self.clipped_at = None

    def hook(self, module: nn.Module, args: tuple, output: Any) -> Any:
        X = _pick(output)
        block, self.calls = self.calls, self.calls + 1
        pm = self.padding.to(X.device)
        if self.clipped_at is None:
            self.clipped_at = torch.full((X.shape[0],), -1, dtype=torch.int64, device=X.device)
        norms = X.detach().double().norm(dim=-1)  # (B, N)
        real = torch.where(pm, norms, torch.nan)
        median = torch.nanquantile(real, 0.5, dim=-1)
        top, where = torch.where(pm, norms, -1.0).max(dim=-1)
        clip = (top >= self.ratio * median) & (median > 0) & (self.clipped_at < 0)
        if not bool(clip.any()):
            return None
        self.clipped_at[clip] = block
        b = torch.nonzero(clip).flatten()
        X = X.clone()
        X[b, where[b]] = X[b, where[b]] * (median[b] / top[b]).to(X.dtype).unsqueeze(-1)
        return _replace(output, X)

    def install(self, model: nn.Module) -> list[Any]:
        """Register the hooks (a reset on the model's forward, the clip on every block);
        returns their handles."""
        handles = [model.register_forward_pre_hook(self.reset)]
        handles.extend(b.register_forward_hook(self.hook) for b in self.blocks.values())
        return handles
