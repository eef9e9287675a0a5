"""Size before allocation: memory estimates checked against a limit before any work.

A request whose estimate exceeds the limit is refused with one line giving the
estimate and the option that lifts it (``--max-memory`` on the command line,
``max_memory=`` in the API), instead of dying in the allocator minutes later.
The default limit is half the machine's physical memory.
"""

from __future__ import annotations

import os
import re

from .errors import MemoryLimitError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def physical_memory() -> int:
    """Bytes of physical memory (``os.sysconf``); 16 GiB where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def default_limit() -> int:
    """Half the physical memory, in bytes."""
    return physical_memory() // 2


def parse_size(text: str | int | float | None, name: str = "max_memory") -> int | None:
    """Bytes in ``text`` (``"8GiB"``, ``"500MB"``, ``"2e9"``, an int); None stays None.

    Raises
    ------
    MemoryLimitError
        Not a positive finite size with a known unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB).
    """
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise MemoryLimitError(f"must be a size such as 8GiB, 500MB or a number of bytes, got {text!r}", argument=name)
    value = float(m.group(1)) * _UNITS[unit]
    if not 0 < value < 2**63:
        raise MemoryLimitError(f"must be a positive size below 2^63 bytes, got {text!r}", argument=name)
    return int(value)


def human(n_bytes: float) -> str:
    """``n_bytes`` in GiB/MiB/KiB with three significant digits."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.3g} {unit}"
    return f"{int(n_bytes)} B"


def check_memory(estimate: float, what: str, max_memory: int | str | None = None, *, adjustable: bool = True) -> None:
    """Refuse ``what`` if its ``estimate`` (bytes) exceeds ``max_memory`` (default
    :func:`default_limit`). ``adjustable=False`` for a caller that takes no
    ``max_memory``: the message then offers only a smaller size.

    Raises
    ------
    MemoryLimitError
        One line: the estimate, the limit and how to lift it.
    """
    limit = parse_size(max_memory) if max_memory is not None else default_limit()
    if estimate > limit and not adjustable:
        raise MemoryLimitError(f"{what} needs about {human(estimate)} of memory, more than the limit "
                               f"{human(limit)} (half the RAM); lower the size")
    if estimate > limit:
        raise MemoryLimitError(
            f"{human(limit)}{'' if max_memory is not None else ' (half the RAM)'} is exceeded: {what} needs about "
            f"{human(estimate)} of memory; lower the size, or raise the limit if the machine has it (e.g. 32GiB)",
            argument="max_memory")


# ------------------------------------------------------------------ simulate's tokens
#: ``(B, N, d)`` arrays in the compute dtype that a pure self-attention layer (one head:
#: ``X <- A X W_V``) holds at its peak besides ``X(0)``: the layer's input ``X(t-1)`` (the
#: keys), the fused projection ``[X W_Q W_K^T | X W_V]`` (two) and the output ``X(t)``.
#: The metrics after the layer add none: μ's centred tokens and then the unit rows of the
#: cosine metrics reuse one kept buffer, and the row-norm and cosine metrics read X itself
#: (``metrics.registry.UNSCALED_METRICS``). Measured with
#: ``ru_maxrss`` (tests/dynamics/test_dynamics_depth_memory.py): 4.2-4.5 on the windowed
#: kernel in float32 and float64, the rest being the plan's index vectors and the chunks.
LAYER_TOKEN_COPIES = 4
#: More arrays for any other block: a norm's output and temporaries, the residual sum,
#: the wider projection and merged output of several heads. Measured over
#: :data:`LAYER_TOKEN_COPIES`: 0.9 (post-norm LayerNorm), 1.8-2.0 (sphere, skip, post-LN,
#: four heads), 3.0-3.2 (pre-LN); 4 keeps the estimate an upper bound.
BLOCK_TOKEN_COPIES = 4
#: More ``(B, N, d)`` arrays per unit of ``mlp_ratio`` with the MLP sublayer (its hidden
#: ``(B, N, mlp_ratio d)`` and GELU output): measured 14.2 copies in all for pre-LN at
#: ``mlp_ratio = 4``.
MLP_TOKEN_COPIES = 2


def simulate_tokens_bytes(n_samples: int, n_tokens: int, d_model: int, itemsize: int, *, depth: int = 0,
                          record_states: bool = False, mlp_ratio: int = 0, input_itemsize: int = 8,
                          pure: bool = False) -> int:
    """Bytes the token arrays of a ``simulate`` run need at its peak: the input ``X(0)``
    ``(B, N, d)`` (``input_itemsize``: float64 as the input registry draws it), the layer's
    working arrays in the compute dtype (:data:`LAYER_TOKEN_COPIES`; unless ``pure``, a
    one-head block without norm, residual or MLP, also :data:`BLOCK_TOKEN_COPIES` and
    :data:`MLP_TOKEN_COPIES`) and, with ``record_states``, the ``depth + 1`` states. For a
    pure block it predicts the peak (the test compares it with ``ru_maxrss``); for the
    others it is an upper bound. Attention scores and weights are estimated apart
    (``dynamics.runner``)."""
    cells = int(n_samples) * int(n_tokens) * int(d_model)
    copies = LAYER_TOKEN_COPIES if pure else LAYER_TOKEN_COPIES + BLOCK_TOKEN_COPIES + MLP_TOKEN_COPIES * int(mlp_ratio)
    states = (int(depth) + 1) * itemsize if record_states else 0
    return cells * (input_itemsize + itemsize * copies + states)


def check_simulate_tokens(n_samples: int, n_tokens: int, d_model: int, itemsize: int, *, depth: int,
                          record_states: bool = False, mlp_ratio: int = 0, input_itemsize: int = 8,
                          pure: bool = False, max_memory: int | str | None = None) -> None:
    """Refuse a ``simulate`` run whose tokens (:func:`simulate_tokens_bytes`) exceed
    ``max_memory``; called by ``simulate`` and, before it draws ``X(0)``, by the command line.

    Raises
    ------
    MemoryLimitError
        The estimate exceeds the limit (one line).
    """
    need = simulate_tokens_bytes(n_samples, n_tokens, d_model, itemsize, depth=depth, record_states=record_states,
                                 mlp_ratio=mlp_ratio, input_itemsize=input_itemsize, pure=pure)
    dtype = {4: "float32", 8: "float64"}.get(itemsize, f"{itemsize}-byte")
    check_memory(need, f"simulating {n_samples} x {n_tokens} x {d_model} tokens (B x N x d, {dtype}, {depth} layers)",
                 max_memory)


# ------------------------------------------------------------------ influence profiles
#: Bytes per token of an influence profile's computation besides its ``(H, N)`` profiles:
#: the mask's row intervals, the interval operator's arrays, its range-sum plans and their
#: scans, one working vector per product. Measured (``ru_maxrss``, N = 2e6): 58-260 on the
#: interval path (causal, sliding and causal windows, complete, documents, with and without
#: decay; the most for documents with decay, planned at many block sizes), 51 + 42 per edge
#: on the CSR path.
INFLUENCE_BYTES_PER_TOKEN = 320
#: Bytes per mask edge on the CSR path (COO pieces while the mask is built at 48 per edge,
#: then the weighted, row-normalised transpose): measured 42.
INFLUENCE_BYTES_PER_EDGE = 64
#: Bytes per layer of depth beyond the profiles (the per-depth summary and its share of the
#: per-layer weights): measured 495.
INFLUENCE_BYTES_PER_LAYER = 1024
#: Bytes per token and per layer of the JSON document (the profile as a list of floats,
#: its text; each per-depth summary): measured 159 per token and 486 per layer.
INFLUENCE_JSON_BYTES_PER_TOKEN, INFLUENCE_JSON_BYTES_PER_LAYER = 256, 1024


def influence_bytes(n_tokens: int, depth: int, *, n_edges: int = 0, n_masks: int = 1, query_all: bool = False,
                    as_json: bool = False) -> int:
    """Bytes :func:`rankcollapse.masks.influence` needs for ``N = n_tokens`` and ``H = depth``:
    the float64 profiles ``(H, N)``, :data:`INFLUENCE_BYTES_PER_TOKEN` per token and
    :data:`INFLUENCE_BYTES_PER_EDGE` per CSR edge (``n_edges``: edges of the masks on the
    CSR path, 0 for interval masks), :data:`INFLUENCE_BYTES_PER_LAYER` per layer; with
    ``query_all`` the dense ``N x N`` float64 matrix of each of the ``n_masks`` masks of a
    schedule's period, the product and two temporaries; with ``as_json`` the document the
    command line prints."""
    n, h = int(n_tokens), int(depth)
    need = 8 * h * n + INFLUENCE_BYTES_PER_TOKEN * n + INFLUENCE_BYTES_PER_EDGE * int(n_edges)
    need += INFLUENCE_BYTES_PER_LAYER * h
    if query_all:
        need += 8 * n * n * (int(n_masks) + 3)
    if as_json:
        need += INFLUENCE_JSON_BYTES_PER_TOKEN * n * (n + 1 if query_all else 1) + INFLUENCE_JSON_BYTES_PER_LAYER * h
    return need
