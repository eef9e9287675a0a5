"""Real pretrained models: loading, recording named activations, interventions, probes.

See ``docs/models.md``. Public API: :func:`load_model`, :class:`LoadedModel`,
:class:`Recorder`, :func:`intervene`, :func:`probe`, :func:`embed`,
:func:`attention_only`.
"""

from .attention_only import attention_only
from .interventions import intervene, parse_drop
from .loading import FAMILIES, LoadedModel, detect_family, load_model
from .probe import PROBE_DEFAULT_METRICS, TABLE_COLUMNS, default_points, embed, model_inputs, probe
from .recorder import Recorder, StopForward

__all__ = [
    "FAMILIES",
    "attention_only",
    "LoadedModel",
    "PROBE_DEFAULT_METRICS",
    "Recorder",
    "StopForward",
    "TABLE_COLUMNS",
    "default_points",
    "detect_family",
    "embed",
    "intervene",
    "load_model",
    "model_inputs",
    "parse_drop",
    "probe",
]
