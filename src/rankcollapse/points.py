"""Names of measurement points, the same for simulated and pretrained networks.

``layer``: blocks applied (0 = the input, ``t`` = ``hidden_states[t]``); ``point``: the
tensor's module path, ``embeddings``, ``layer.{k}.output`` (at ``layer = k + 1``), for
models also ``layer.{k}.input``, ... and ``final_norm`` (:mod:`rankcollapse.models.families`).
"""

from __future__ import annotations

INPUT = "embeddings"


def block_output(k: int, prefix: str = "") -> str:
    """``layer.{k}.output``: the output of block ``k`` (0-based), at ``layer = k + 1``."""
    return f"{prefix}layer.{k}.output"


def point_after(t: int, prefix: str = "") -> str:
    """The point after ``t`` layers: ``embeddings`` for ``t = 0``, else ``layer.{t-1}.output``."""
    return f"{prefix}{INPUT}" if t == 0 else block_output(t - 1, prefix)


def layer_of(point: str, n_layers: int) -> int:
    """The ``layer`` of ``point`` (no stack prefix) in ``n_layers`` blocks: 0 for ``embeddings``
    and ``layer.0.input``, ``k + 1`` for other points of block ``k``, ``n_layers`` for ``final_norm``;
    ``ValueError`` for any other name or a block not below ``n_layers``."""
    if point == INPUT:
        return 0
    if point == "final_norm":
        return n_layers
    parts = point.split(".", 2)
    if len(parts) != 3 or parts[0] != "layer" or not parts[1].isdigit() or not parts[2] or int(parts[1]) >= n_layers:
        raise ValueError(f"{point!r} is not a point of a network of {n_layers} layers (embeddings, layer.k.output "
                         f"with k < {n_layers}, final_norm...)")
    return int(parts[1]) + (0 if parts[2] == "input" else 1)
