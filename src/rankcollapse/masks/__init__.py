"""Attention masks as graphs (spec.md §1, §4).

One convention everywhere: ``M[i, j] = True`` iff token ``i`` attends to token ``j``
(graph edge ``j -> i``), 0-based. Build masks with the named constructors or
:func:`parse_mask` (``"causal_sliding_window:w=4"``, ``"causal&sliding_window:w=9"``),
analyse them with :func:`analyze`, accept any mask form with :func:`resolve_mask`
/ :func:`dense_mask` (:mod:`.adapt`), convert them with :mod:`rankcollapse.masks.convert`.
"""

from typing import TYPE_CHECKING

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "constructors": (
        "block", "causal", "causal_sliding_window", "complete", "dilated", "documents", "prefix",
        "sliding_window",
    ),
    "adapt": ("MaskInput", "dense_mask", "resolve_mask"),
    "graph": ("MaskAnalysis", "analyze", "bfs_distances"),
    "influence": ("Influence", "influence"),
    "mask": ("Mask",),
    "plot": ("draw_mask",),
    "rates": ("compare_masks",),
    "patterns": ("bigbird", "fixed", "from_file", "longformer", "random", "strided"),
    "rows": ("check_rows_allow_key", "empty_rows"),
    "schedule": ("MaskSchedule", "is_schedule", "parse_schedule"),
    "schedule_rates": ("compare_schedules", "describe_schedule"),
    "spec": ("MASK_KINDS", "parse_mask", "spec_n_tokens"),
})

if TYPE_CHECKING:  # the same imports, eager, for readers and static tools
    from .constructors import (
        block, causal, causal_sliding_window, complete, dilated, documents, prefix, sliding_window,
    )
    from .adapt import MaskInput, dense_mask, resolve_mask
    from .graph import MaskAnalysis, analyze, bfs_distances
    from .influence import Influence, influence
    from .mask import Mask
    from .plot import draw_mask
    from .rates import compare_masks
    from .patterns import bigbird, fixed, from_file, longformer, random, strided
    from .rows import check_rows_allow_key, empty_rows
    from .schedule import MaskSchedule, is_schedule, parse_schedule
    from .schedule_rates import compare_schedules, describe_schedule
    from .spec import MASK_KINDS, parse_mask, spec_n_tokens
