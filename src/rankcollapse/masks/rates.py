"""Deprecated module: its names moved to :mod:`rankcollapse.theory` (removed in 0.3.0).

``compare_masks`` is now :func:`rankcollapse.theory.rates.compare_masks`; the formula
names ``EXPONENTS``, ``collapse_envelope``, ``epsilon_lower_bound``,
``log10_layers_per_decade``, ``log_contraction`` live in
:mod:`rankcollapse.theory.envelope`, the home of every Theorem-1 quantity. Each access
here warns (FutureWarning) and returns the object from its new home; ``masks`` itself
never imports ``theory`` (docs/masks.md).
"""

from .._lazy import forward

_ENVELOPE = "rankcollapse.theory.envelope"
__getattr__ = forward(__name__, {
    "compare_masks": "rankcollapse.theory.rates",
    **{name: _ENVELOPE for name in ("EXPONENTS", "collapse_envelope", "epsilon_lower_bound", "log10_layers_per_decade",
                                    "log_contraction")},
})
