"""Attention masks as graphs (spec.md §1, §4).

One convention everywhere: ``M[i, j] = True`` iff token ``i`` attends to token ``j``
(graph edge ``j -> i``), 0-based. Build masks with the named constructors or
:func:`parse_mask` (``"causal_sliding_window:w=4"``, ``"causal&sliding_window:w=9"``),
analyse them with :func:`analyze`, accept any mask form with :func:`resolve_mask`
/ :func:`dense_mask` (:mod:`.adapt`), convert them with :mod:`rankcollapse.masks.convert`.
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
from .adapt import MaskInput, dense_mask, resolve_mask
from .graph import MaskAnalysis, analyze, bfs_distances
from .mask import Mask
from .patterns import bigbird, fixed, from_file, longformer, random, strided
from .rows import check_rows_allow_key, empty_rows
from .spec import MASK_KINDS, parse_mask

__all__ = [
    "MASK_KINDS",
    "Mask",
    "MaskAnalysis",
    "MaskInput",
    "analyze",
    "bfs_distances",
    "bigbird",
    "block",
    "causal",
    "causal_sliding_window",
    "check_rows_allow_key",
    "complete",
    "dense_mask",
    "dilated",
    "documents",
    "empty_rows",
    "fixed",
    "from_file",
    "longformer",
    "parse_mask",
    "prefix",
    "random",
    "resolve_mask",
    "sliding_window",
    "strided",
]
