"""Per-layer masks in the simulator: layer ``t`` attends through ``schedule.layer(t)``.

:class:`ScheduledAttention` wraps one :class:`~rankcollapse.dynamics.layers.Attention`
per distinct mask of a :class:`~rankcollapse.masks.schedule.MaskSchedule` and
dispatches on the layer counter (every block calls its attention exactly once per
layer, in every placement). Records (ε, attention matrices) go to shared lists in
layer order.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..masks.mask import Mask


class ScheduledAttention:
    """Attention whose mask follows a schedule; same call signature as ``Attention``.

    Parameters
    ----------
    schedule : MaskSchedule.
    make : callable ``Mask -> Attention`` building the attention of one mask.
    """

    def __init__(self, schedule, make: Callable[[Mask], object]):
        built: dict[int, object] = {}
        self.epsilon: list[torch.Tensor] = []
        self.attention: list[torch.Tensor] = []
        self.row_mass: list[torch.Tensor] = []
        self.layers = []
        for m in schedule.masks:
            if id(m) not in built:
                att = make(m)  # a schedule holds Masks, validated for its N
                # one record, layer order
                att.epsilon, att.attention, att.row_mass = self.epsilon, self.attention, self.row_mass
                built[id(m)] = att
            self.layers.append(built[id(m)])
        self.t = 0

    def __call__(self, X: torch.Tensor, lw, x_peak: float | None = None) -> torch.Tensor:
        att = self.layers[self.t % len(self.layers)]
        self.t += 1
        return att(X, lw, x_peak)
