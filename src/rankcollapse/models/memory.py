"""The memory of a probe, predicted before it runs
(:func:`~rankcollapse.models.probe.probe_memory`), and the batch size that fits a limit.

A probe holds the model's weights throughout; one batch of ``b`` windows of ``N``
tokens adds, per window (``d`` the width, ``f`` the MLP width, ``H`` heads, ``L``
blocks in all stacks, ``P`` recorded points, ``s`` the model's bytes per element):

- the recorded points, ``P · N · d · s``, held until their metrics are computed;
- with attention or sink metrics, every block's probabilities, ``L · H · N² · s``,
  held until the forward pass ends;
- the larger of the forward pass's working set (:data:`FORWARD_TOKEN_COPIES`
  ``(N, d)`` arrays, two ``(N, f)``, and :data:`SCORE_COPIES` float32 ``(H, N, N)``
  arrays of one block's attention) and the metrics' (the token metrics' own estimate,
  :func:`~rankcollapse.metrics.registry.metrics_bytes` in float64, and
  :data:`MAP_METRIC_COPIES` float64 ``(H, N, N)`` arrays while an attention map is measured).

GQA models form ``H`` (query heads) score rows, so ``H`` is the query heads' count.

plus :data:`OVERHEAD` per probe, the allocator's and libraries' buffers. The prediction
is a best estimate of the growth a probe adds to the process: measured on CPU with a
tiny Llama (d = 32, 3 blocks, attention entropy and avg |cos|, N = 384 and 768, in
batches of 2), the growth of the peak resident set (``VmHWM``) over the resident set
before the run was 0.59 to 1.1 times the prediction. To fit a limit,
:meth:`ProbeMemory.batch_size` counts each window :data:`HEADROOM` times.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._memory import check_memory, human, parse_size

#: The factor on ``per_window`` when a batch size is fitted to a limit (the largest
#: measured / predicted growth seen, 1.1, with a margin).
HEADROOM = 1.5
#: Bytes a probe adds besides its windows: the allocator's arenas and library buffers
#: (measured 20 to 40 MiB beyond the per-window terms on CPU).
OVERHEAD = 32 * 2**20
#: ``(N, d)`` arrays per window alive at once in a block's forward pass besides the
#: recorded points (residual, norm output, queries, keys, values, attention output,
#: branch sum, a cast).
FORWARD_TOKEN_COPIES = 8
#: float32 ``(H, N, N)`` arrays per window in one block's attention when its
#: probabilities are formed (eager attention, or SDPA rows recorded: scores, scaled,
#: masked, probabilities, the kernel's own); an SDPA model that records none forms
#: :data:`SDPA_SCORE_COPIES` (its CPU kernel takes the math path under a padding mask).
SCORE_COPIES = 5
SDPA_SCORE_COPIES = 2
#: float64 ``(H, N, N)`` arrays per window while an attention metric measures one map
#: (the float64 cast, masked copies, logarithms): calibrated on ``attention_entropy``,
#: which measured about 46 bytes per ``H N²`` element beside the held maps; the sink
#: metrics hold :data:`SINK_METRIC_COPIES`.
MAP_METRIC_COPIES = 6
SINK_METRIC_COPIES = 2


@dataclass(frozen=True)
class ProbeMemory:
    """Predicted bytes of a probe: ``weights`` (parameters and buffers), plus
    :data:`OVERHEAD`, plus ``per_window`` for each window of a batch."""

    weights: int
    per_window: int

    def peak(self, batch_size: int) -> int:
        """Predicted peak bytes with ``batch_size`` windows per forward pass."""
        return self.weights + OVERHEAD + batch_size * self.per_window

    def batch_size(self, max_memory: int | str, most: int) -> int:
        """The largest batch size up to ``most`` whose peak, each window counted
        :data:`HEADROOM` times, fits ``max_memory``.

        Raises
        ------
        MemoryLimitError
            Not even one window fits.
        """
        window = HEADROOM * self.per_window
        check_memory(self.weights + OVERHEAD + window, "probing one window (weights included)", max_memory)
        limit = parse_size(max_memory)
        return max(1, min(most, int((limit - self.weights - OVERHEAD) // max(window, 1))))

    def __str__(self) -> str:
        return f"weights {human(self.weights)} + {human(OVERHEAD)} + {human(self.per_window)} per window"


__all__ = ["FORWARD_TOKEN_COPIES", "HEADROOM", "OVERHEAD", "MAP_METRIC_COPIES", "SCORE_COPIES", "SDPA_SCORE_COPIES", "SINK_METRIC_COPIES",
           "ProbeMemory"]
