"""Self-attention dynamics (spec.md §2): masked attention, blocks, weights, simulator."""

from .config import VARIANTS, BlockConfig
from .inputs import gaussian_tokens, hemisphere_tokens, sphere_tokens
from .runner import SimResult, simulate
from .weights import LayerWeights

__all__ = [
    "VARIANTS",
    "BlockConfig",
    "LayerWeights",
    "SimResult",
    "gaussian_tokens",
    "hemisphere_tokens",
    "simulate",
    "sphere_tokens",
]
