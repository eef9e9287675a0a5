"""Self-attention dynamics (spec.md §2): masked attention, blocks, weights, simulator.

The one home of the layer update: every layer the package runs is computed here, by
:func:`.layers.block_forward` (what :func:`simulate` runs) or by its fast path for one head
without MLP on per-sample weights, :func:`.single_head.single_head_layer` (the phase sweep,
the Theorem-2 check, :class:`rankcollapse.theory.AttentionSystem`). Zero rows under the
``sphere`` norm follow one rule, stated in :func:`.layers.sphere`.

Layering (pyproject.toml ``[tool.importlinter]``, tests/test_layering.py): ``dynamics`` may import
``models`` (the families of pretrained weights), ``metrics``, ``masks``, ``errors`` and
the private utility modules; never ``theory``, ``phase``, ``experiments`` or ``cli``.
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, written once: imported lazily on first use (attach_imports reads this
# block), eagerly by readers and static tools.
if TYPE_CHECKING:
    from .config import VARIANTS, BlockConfig, RunConfig, resolve_variant
    from .inputs import INPUTS, gaussian_tokens, hemisphere_tokens, make_tokens, sphere_tokens
    from .pretrained import extract_attention_weights
    from .runner import SimResult, simulate
    from .weights import LayerWeights

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
