"""Real pretrained models: loading, recording named activations, interventions, probes
(docs/models.md). ``models`` never imports ``dynamics``, ``theory``, ``phase``,
``experiments`` or ``cli`` (pyproject.toml ``[tool.importlinter]``).
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports: imported lazily on first use (attach_imports reads this block), eagerly by static tools.
if TYPE_CHECKING:
    from .attention_only import attention_only
    from .edits import EditContext, HeadAblation
    from .interventions import d_qk_scale_for, intervene, model_d_qk
    from .loading import FAMILIES, LoadedModel, as_loaded, detect_family, load_model
    from .memory import ProbeMemory
    from .probe import (PROBE_DEFAULT_METRICS, TABLE_COLUMNS, Intervention, attention_maps, default_points, embed,
                        embedding_rank_note, layernorm_rank_note, model_inputs, position_ids, probe, probe_memory)
    from .plot import plot_layers
    from .parity import check_parity, parity
    from .patching import patch
    from .recorder import Recorder
    from .states import States, capture_states, read_states, save_states, states_table

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
