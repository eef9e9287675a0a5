"""Self-attention dynamics (spec.md §2): masked attention, blocks, weights, simulator.

The one home of the layer update: :func:`.layers.block_forward` (what :func:`simulate` runs)
and its one-head fast path :func:`.single_head.single_head_layer`. Imports ``models``,
``metrics``, ``masks``, never ``theory``, ``phase``, ``experiments`` or ``cli`` (pyproject.toml).
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, imported lazily on first use (attach_imports reads this block).
if TYPE_CHECKING:
    from .config import VARIANTS, BlockConfig, RunConfig, resolve_variant
    from .inputs import INPUTS, gaussian_tokens, hemisphere_tokens, make_tokens, sphere_tokens
    from .pretrained import extract_attention_weights
    from .runner import SimResult, simulate
    from .weights import LayerWeights

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
