"""Attention masks as graphs (spec.md §1, §4).

One convention everywhere: ``M[i, j] = True`` iff token ``i`` attends to token ``j``
(graph edge ``j -> i``), 0-based. Build masks with the named constructors or
:func:`parse_mask` (``"causal_sliding_window:w=4"``, ``"causal&sliding_window:w=9"``),
analyse them with :func:`analyze`, convert them with :mod:`rankcollapse.masks.convert`.
"""

from .constructors import (
    block,
    causal,
    causal_sliding_window,
    complete,
    dilated,
    documents,
    prefix,
    sliding_window,
)
from .graph import MaskAnalysis, analyze, bfs_distances
from .mask import Mask
from .patterns import bigbird, fixed, from_file, longformer, random, strided
from .spec import MASK_KINDS, parse_mask

__all__ = [
    "MASK_KINDS",
    "Mask",
    "MaskAnalysis",
    "analyze",
    "bfs_distances",
    "bigbird",
    "block",
    "causal",
    "causal_sliding_window",
    "complete",
    "dilated",
    "documents",
    "fixed",
    "from_file",
    "longformer",
    "parse_mask",
    "prefix",
    "random",
    "sliding_window",
    "strided",
]
