"""rankcollapse: measure, simulate and explain rank collapse in self-attention.

Token matrices are ``(N, d)`` (one token per row) or batched ``(B, N, d)``.
Masks follow one convention everywhere: ``M[i, j] = True`` iff token ``i`` attends
to token ``j`` (graph edge ``j -> i``). See ``docs/spec.md`` (specification) and ``docs/theory.md`` (derivations).
"""

__version__ = "0.1.0"

import importlib

#: Subpackages and modules of the public API, imported on first attribute access
#: (PEP 562): ``import rankcollapse`` stays cheap, ``rankcollapse.masks.causal(8)`` and
#: ``rankcollapse.errors.MaskError`` work without a separate import.
SUBPACKAGES = ("masks", "metrics", "dynamics", "models", "theory", "sweep", "experiments", "phase", "data", "points",
               "errors")

__all__ = list(SUBPACKAGES)


def __getattr__(name: str):
    if name in SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SUBPACKAGES))
