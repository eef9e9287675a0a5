"""Size before allocation: memory estimates checked against a limit (default half the RAM)
before any work, refused in one line naming ``max_memory`` (``--max-memory``)."""

from __future__ import annotations

import os
import re

from .errors import MemoryLimitError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def default_limit() -> int:
    """Half the physical memory in bytes (of 16 GiB where ``os.sysconf`` cannot read it)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES")) // 2
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30 // 2


def parse_size(text: str | int | float | None, name: str = "max_memory") -> int | None:
    """Bytes in ``text`` (``"8GiB"``, ``"500MB"``, ``"2e9"``, an int); None stays None.
    :class:`MemoryLimitError` for anything but a positive finite size with a known unit (B, kB,
    MB, GB, TB, KiB, MiB, GiB, TiB)."""
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
    """Refuse ``what`` (:class:`MemoryLimitError`) if its ``estimate`` (bytes) exceeds ``max_memory``
    (default :func:`default_limit`); ``adjustable=False``: the caller takes no ``max_memory``."""
    limit = parse_size(max_memory) if max_memory is not None else default_limit()
    if estimate > limit and not adjustable:
        raise MemoryLimitError(f"{what} needs about {human(estimate)} of memory, more than the limit "
                               f"{human(limit)} (half the RAM); lower the size")
    if estimate > limit:
        raise MemoryLimitError(
            f"{human(limit)}{'' if max_memory is not None else ' (half the RAM)'} is exceeded: {what} needs about "
            f"{human(estimate)} of memory; lower the size, or raise the limit if the machine has it (e.g. 32GiB)",
            argument="max_memory")


#: ``(B, N, d)`` arrays a pure one-head layer holds at its peak besides ``X(0)``: its input
#: (the keys), the fused projection ``[X W_Q W_K^T | X W_V]`` (two) and its output; the
#: metrics reuse one buffer (checked with ``ru_maxrss``, tests/dynamics/test_dynamics_depth_memory.py).
LAYER_TOKEN_COPIES = 4
#: More arrays for any other block (norm, residual sum, several heads): an upper bound.
BLOCK_TOKEN_COPIES = 4
#: More ``(B, N, d)`` arrays per unit of ``mlp_ratio`` with the MLP sublayer.
MLP_TOKEN_COPIES = 2


def simulate_tokens_bytes(n_samples: int, n_tokens: int, d_model: int, itemsize: int, *, depth: int = 0,
                          record_states: bool = False, mlp_ratio: int = 0, input_itemsize: int = 8,
                          pure: bool = False) -> int:
    """Peak bytes of a ``simulate`` run's token arrays: ``X(0)`` in ``input_itemsize``, the
    layer's working copies in ``itemsize`` (more unless ``pure``: one head, no norm, residual
    or MLP) and with ``record_states`` the ``depth + 1`` states. The peak for a pure block,
    else an upper bound; attention is estimated apart (``dynamics.runner``)."""
    cells = int(n_samples) * int(n_tokens) * int(d_model)
    copies = LAYER_TOKEN_COPIES if pure else LAYER_TOKEN_COPIES + BLOCK_TOKEN_COPIES + MLP_TOKEN_COPIES * int(mlp_ratio)
    states = (int(depth) + 1) * itemsize if record_states else 0
    return cells * (input_itemsize + itemsize * copies + states)


def check_simulate_tokens(n_samples: int, n_tokens: int, d_model: int, itemsize: int, *, depth: int,
                          record_states: bool = False, mlp_ratio: int = 0, input_itemsize: int = 8,
                          pure: bool = False, max_memory: int | str | None = None) -> None:
    """Refuse (:class:`MemoryLimitError`) a ``simulate`` run whose tokens
    (:func:`simulate_tokens_bytes`) exceed ``max_memory``."""
    need = simulate_tokens_bytes(n_samples, n_tokens, d_model, itemsize, depth=depth, record_states=record_states,
                                 mlp_ratio=mlp_ratio, input_itemsize=input_itemsize, pure=pure)
    dtype = {4: "float32", 8: "float64"}.get(itemsize, f"{itemsize}-byte")
    check_memory(need, f"simulating {n_samples} x {n_tokens} x {d_model} tokens (B x N x d, {dtype}, {depth} layers)",
                 max_memory)


#: Bytes per token of an influence computation besides its ``(H, N)`` profiles (row
#: intervals, range-sum plans, working vectors; ``ru_maxrss`` at N = 2e6 stays below it).
INFLUENCE_BYTES_PER_TOKEN = 320
#: Bytes per mask edge on the CSR path (COO pieces, then the row-normalised transpose).
INFLUENCE_BYTES_PER_EDGE = 64
#: Bytes per layer of depth beyond the profiles (the per-depth summary and weights).
INFLUENCE_BYTES_PER_LAYER = 1024
#: Bytes per token and per layer of the JSON document.
INFLUENCE_JSON_BYTES_PER_TOKEN, INFLUENCE_JSON_BYTES_PER_LAYER = 256, 1024


def influence_bytes(n_tokens: int, depth: int, *, n_edges: int = 0, n_masks: int = 1, query_all: bool = False,
                    as_json: bool = False) -> int:
    """Bytes :func:`rankcollapse.masks.influence` needs for ``N = n_tokens``, ``H = depth``:
    float64 profiles ``(H, N)``, the per-token, per-edge (``n_edges`` on the CSR path) and
    per-layer costs; with ``query_all`` dense ``N x N`` matrices for ``n_masks`` masks plus
    three; with ``as_json`` the printed document."""
    n, h = int(n_tokens), int(depth)
    need = 8 * h * n + INFLUENCE_BYTES_PER_TOKEN * n + INFLUENCE_BYTES_PER_EDGE * int(n_edges)
    need += INFLUENCE_BYTES_PER_LAYER * h
    if query_all:
        need += 8 * n * n * (int(n_masks) + 3)
    if as_json:
        need += INFLUENCE_JSON_BYTES_PER_TOKEN * n * (n + 1 if query_all else 1) + INFLUENCE_JSON_BYTES_PER_LAYER * h
    return need
