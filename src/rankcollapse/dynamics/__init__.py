"""Self-attention dynamics (spec.md §2): masked attention, blocks, weights, simulator."""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, written once: imported lazily on first use (attach_imports reads this
# block), eagerly by readers and static tools.
if TYPE_CHECKING:
    from .config import VARIANTS, BlockConfig, resolve_variant
    from .inputs import gaussian_tokens, hemisphere_tokens, sphere_tokens
    from .pretrained import extract_attention_weights
    from .runner import SimResult, simulate
    from .weights import LayerWeights

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
