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


def parse_size(text: str | int | float | None, name: str = "--max-memory") -> int | None:
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
        raise MemoryLimitError(f"{name} must be a size such as 8GiB, 500MB or a number of bytes, got {text!r}")
    value = float(m.group(1)) * _UNITS[unit]
    if not 0 < value < 2**63:
        raise MemoryLimitError(f"{name} must be a positive size below 2^63 bytes, got {text!r}")
    return int(value)


def human(n_bytes: float) -> str:
    """``n_bytes`` in GiB/MiB/KiB with three significant digits."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.3g} {unit}"
    return f"{int(n_bytes)} B"


def check_memory(estimate: float, what: str, max_memory: int | str | None = None) -> None:
    """Refuse ``what`` if its ``estimate`` (bytes) exceeds ``max_memory`` (default
    :func:`default_limit`).

    Raises
    ------
    MemoryLimitError
        One line: the estimate, the limit and how to lift it.
    """
    limit = parse_size(max_memory) if max_memory is not None else default_limit()
    if estimate > limit:
        raise MemoryLimitError(
            f"{what} needs about {human(estimate)} of memory, more than the limit {human(limit)}; "
            f"lower the size, or raise the limit with max_memory (--max-memory on the command line) if the machine has it")
