"""rankcollapse: measure, simulate and explain rank collapse in self-attention.

Token matrices are ``(N, d)`` (one token per row) or batched ``(B, N, d)``.
Masks follow one convention everywhere: ``M[i, j] = True`` iff token ``i`` attends
to token ``j`` (graph edge ``j -> i``). See ``docs/spec.md`` (specification) and ``docs/theory.md`` (derivations).
"""

__version__ = "0.1.0"
