"""Attention masks as graphs (spec.md §1, §4; docs/masks.md): ``M[i, j] = True`` iff token
``i`` attends to token ``j`` (graph edge ``j -> i``), 0-based. Build masks with the constructors
or :func:`parse_mask`, analyse them with :func:`analyze`, read any form: :func:`resolve_mask`."""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, imported lazily on first use (attach_imports reads this block).
if TYPE_CHECKING:
    from .constructors import (bigbird, block, causal, causal_sliding_window, complete, dilated, documents, fixed,
                               from_file, longformer, prefix, random, sliding_window, strided)
    from .adapt import dense_mask, resolve_mask
    from .graph import MaskAnalysis, analyze, bfs_distances, draw_mask
    from .influence import Influence, influence
    from .mask import Mask
    from .rows import check_rows_allow_key
    from .schedule import MaskSchedule, is_schedule, parse_schedule, schedule_or_mask
    from .spec import MASK_KINDS, parse_mask, spec_n_tokens

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
