"""Per-layer masks in the simulator: layer ``t`` attends through ``schedule.layer(t)``."""

from __future__ import annotations

from typing import Callable

import torch

from ..masks.mask import Mask


class ScheduledAttention:
    """Attention whose mask follows a ``MaskSchedule``: one ``make(mask) -> Attention`` per
    distinct mask, chosen by the layer counter (every block calls its attention once per
    layer); the records go to shared lists in layer order."""

    def __init__(self, schedule, make: Callable[[Mask], object]):
        built: dict[int, object] = {}
        self.epsilon: list[torch.Tensor] = []
        self.attention: list[torch.Tensor] = []
        self.row_mass: list[torch.Tensor] = []
        self.layers = []
        for m in schedule.masks:
            if id(m) not in built:
                att = make(m)
                att.epsilon, att.attention, att.row_mass = self.epsilon, self.attention, self.row_mass
                built[id(m)] = att
            self.layers.append(built[id(m)])
        self.t = 0

    def __call__(self, X: torch.Tensor, lw, x_peak: float | None = None, **kwargs) -> torch.Tensor:
        att = self.layers[self.t % len(self.layers)]
        self.t += 1
        return att(X, lw, x_peak, **kwargs)
