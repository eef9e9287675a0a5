"""rankcollapse: measure, simulate and explain rank collapse in self-attention.

Tokens are ``(N, d)`` or ``(B, N, d)``; ``M[i, j] = True`` iff token ``i`` attends to token
``j`` (edge ``j -> i``). See ``docs/spec.md`` and ``docs/theory.md``.
"""

__version__ = "0.1.0"

import importlib

#: The public subpackages and modules, imported on first attribute access (PEP 562).
SUBPACKAGES = ("masks", "metrics", "dynamics", "models", "theory", "sweep", "experiments", "phase", "data", "points",
               "errors")

__all__ = list(SUBPACKAGES)


def __getattr__(name: str):
    if name in SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SUBPACKAGES))
