"""The memory of a probe, predicted before it runs
(:func:`~rankcollapse.models.probe.probe_memory`), and the batch size that fits a limit
(docs/models.md, "Planning memory"). Per window: the recorded points, every block's
attention probabilities when measured, and the larger of the forward pass's and the
metrics' working sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .._memory import check_memory, human, parse_size

#: The factor on ``per_window`` when a batch size is fitted to a limit (the largest measured
#: / predicted growth, 1.1, with a margin).
HEADROOM = 1.5
#: Bytes a probe adds besides its windows: the allocator's arenas and library buffers.
OVERHEAD = 32 * 2**20
#: ``(N, d)`` arrays per window alive at once in a block's forward pass besides the recorded points.
FORWARD_TOKEN_COPIES = 8
#: float32 ``(H, N, N)`` arrays per window in one block's attention when its probabilities
#: are formed; an SDPA model that records none forms :data:`SDPA_SCORE_COPIES`.
SCORE_COPIES = 5
SDPA_SCORE_COPIES = 2
#: float64 ``(H, N, N)`` arrays per window while an attention metric (calibrated on
#: ``attention_entropy``) or a sink metric measures one map.
MAP_METRIC_COPIES = 6
SINK_METRIC_COPIES = 2


@dataclass(frozen=True)
class ProbeMemory:
    """Predicted bytes of a probe: ``weights``, plus :data:`OVERHEAD`, plus ``per_window``
    for each window of a batch."""

    weights: int
    per_window: int

    def peak(self, batch_size: int) -> int:
        """Predicted peak bytes with ``batch_size`` windows per forward pass."""
        return self.weights + OVERHEAD + batch_size * self.per_window

    def batch_size(self, max_memory: int | str, most: int) -> int:
        """The largest batch size up to ``most`` whose peak, each window counted :data:`HEADROOM`
        times, fits ``max_memory``; :class:`MemoryLimitError` when not even one window fits."""
        window = HEADROOM * self.per_window
        check_memory(self.weights + OVERHEAD + window, "probing one window (weights included)", max_memory)
        limit = parse_size(max_memory)
        return max(1, min(most, int((limit - self.weights - OVERHEAD) // max(window, 1))))

    def __str__(self) -> str:
        return f"weights {human(self.weights)} + {human(OVERHEAD)} + {human(self.per_window)} per window"


def _config_int(config: Any, names: Sequence[str], default: int) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


def predict(loaded: Any, n_tokens: int, n_points: int, token_names: Sequence[str], attn_names: Sequence[str],
            sink_names: Sequence[str]) -> ProbeMemory:
    """The :class:`ProbeMemory` of a probe of ``loaded`` recording ``n_points`` points, by metric kind."""
    from ..metrics.registry import metrics_bytes
    from . import families
    from .edits import HEAD_KEYS

    model = loaded.model
    tensors = [*model.parameters(), *model.buffers()]
    weights = sum(t.numel() * t.element_size() for t in tensors)
    s = tensors[0].element_size() if tensors else 4
    config = model.config
    d = _config_int(config, ("hidden_size", "n_embd", "d_model", "dim"), 0)
    f = _config_int(config, ("intermediate_size", "n_inner", "d_ff", "ffn_dim", "hidden_dim"), 4 * d)
    heads = _config_int(config, HEAD_KEYS, 1)
    n_blocks = sum(st.n_layers for st in families.stacks(model, loaded.family))
    measured_maps = bool(attn_names)
    attention = measured_maps or bool(sink_names)
    eager = getattr(config, "_attn_implementation", "eager") == "eager"
    N = int(n_tokens)
    records = n_points * N * d * s
    maps = n_blocks * heads * N * N * s if attention else 0
    scores = SCORE_COPIES if attention or eager else SDPA_SCORE_COPIES
    forward = (FORWARD_TOKEN_COPIES * N * d + 2 * N * f) * s + scores * heads * N * N * 4
    map_copies = MAP_METRIC_COPIES if measured_maps else SINK_METRIC_COPIES if attention else 0
    measure = max(metrics_bytes((1, N, d), token_names, 8)[0] if token_names else 0, map_copies * heads * N * N * 8)
    return ProbeMemory(int(weights), int(records + maps + max(forward, measure)))


__all__ = ["FORWARD_TOKEN_COPIES", "HEADROOM", "OVERHEAD", "MAP_METRIC_COPIES", "SCORE_COPIES", "SDPA_SCORE_COPIES", "SINK_METRIC_COPIES",
           "ProbeMemory", "predict"]
