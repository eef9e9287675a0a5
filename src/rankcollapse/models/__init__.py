"""Real pretrained models: loading, recording named activations, interventions, probes.

See ``docs/models.md``. Public API: :func:`load_model`, :class:`LoadedModel`,
:class:`Recorder`, :func:`intervene`, :func:`probe` (and its :class:`Intervention`), :func:`embed`,
:func:`attention_maps`, :func:`attention_only`, :func:`as_loaded`, :func:`plot_layers`;
edits inside the model: :class:`HeadAblation`, :class:`EditContext`, :func:`patch`; and hidden states on disk: :class:`States`, :func:`capture_states`, :func:`save_states`,
:func:`read_states`, :func:`states_table`; parity with transformers: :func:`parity`,
:func:`check_parity`; the memory of a probe: :func:`probe_memory`.

Layering (pyproject.toml ``[tool.importlinter]``, tests/test_layering.py): ``models`` may import
``metrics``, ``masks``, ``data``, ``points``, ``assets``, ``errors`` and the private
utility modules; never ``dynamics``, ``theory``, ``phase``, ``experiments`` or ``cli``.
"""

from typing import TYPE_CHECKING

from .._lazy import attach_imports

# The exports, written once: imported lazily on first use (attach_imports reads this
# block), eagerly by readers and static tools.
if TYPE_CHECKING:
    from .attention_only import attention_only
    from .edits import EditContext, HeadAblation
    from .interventions import intervene
    from .loading import FAMILIES, LoadedModel, as_loaded, detect_family, load_model
    from .memory import ProbeMemory
    from .probe import (
        PROBE_DEFAULT_METRICS, TABLE_COLUMNS, Intervention, attention_maps, default_points, embed, embedding_rank_note,
        layernorm_rank_note,
        model_inputs, position_ids, probe, probe_memory,
    )
    from .plot import plot_layers
    from .parity import check_parity, parity
    from .patching import patch
    from .recorder import Recorder
    from .states import States, capture_states, read_states, save_states, states_table
    from .temperature import d_qk_scale_for, model_d_qk

__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)
