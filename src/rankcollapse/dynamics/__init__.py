"""Self-attention dynamics (spec.md §2): masked attention, blocks, weights, simulator."""

from typing import TYPE_CHECKING

from .._lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {
    "config": ("VARIANTS", "BlockConfig", "RunConfig", "resolve_variant"),
    "inputs": ("INPUTS", "gaussian_tokens", "hemisphere_tokens", "make_tokens", "sphere_tokens"),
    "pretrained": ("extract_attention_weights",),
    "runner": ("SimResult", "simulate"),
    "weights": ("LayerWeights",),
})

if TYPE_CHECKING:  # the same imports, eager, for readers and static tools
    from .config import VARIANTS, BlockConfig, RunConfig, resolve_variant
    from .inputs import INPUTS, gaussian_tokens, hemisphere_tokens, make_tokens, sphere_tokens
    from .pretrained import extract_attention_weights
    from .runner import SimResult, simulate
    from .weights import LayerWeights
