"""Mask spec strings: ``NAME``, ``NAME:key=value,...``, ``file:PATH``, composed with ``&``
(binds tighter) and ``|``, grouped with parentheses: ``(causal|sliding_window:w=3)&block:size=4``.
Values: integers, floats, booleans (``true/false/1/0/yes/no``), ``+``-separated integer lists."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import MaskError, excerpt
from . import constructors as c
from ._build import check_edges
from .._validate import REQUIRED, Key, Spec, check_int
from .mask import Mask, combine
from .rows import check_rows_allow_key

@dataclass(frozen=True)
class MaskKind:
    """A named constructor and the keys its spec accepts."""

    name: str
    build: Callable[..., Mask]
    keys: tuple[Key, ...]
    summary: str


_W_ODD, _CAUSAL = Key("w", "int", help="odd window width 2h+1"), Key("causal", "bool", False)
MASK_KINDS: dict[str, MaskKind] = {kind.name: kind for kind in (
    MaskKind("complete", c.complete, (), "every token attends to every token"),
    MaskKind("causal", c.causal, (), "token i attends to j <= i"),
    MaskKind("sliding_window", c.sliding_window, (_W_ODD,), "|i - j| <= (w-1)/2"),
    MaskKind("causal_sliding_window", c.causal_sliding_window,
             (Key("w", "int", help="window width incl. the query"),), "i-w+1 <= j <= i"),
    MaskKind("dilated", c.dilated, (Key("w", "int"), Key("dilation", "int"), _CAUSAL),
             "window of w keys spaced by dilation"),
    MaskKind("prefix", c.prefix, (Key("k", "int", help="prefix length"),),
             "prefix tokens bidirectional, rest causal"),
    MaskKind("block", c.block, (Key("size", "int"), _CAUSAL), "block-local attention"),
    MaskKind("documents", c.documents, (Key("lengths", "ints", help="e.g. 3+5+8"), _CAUSAL),
             "packed documents, block diagonal"),
    MaskKind("strided", c.strided, (Key("stride", "int"),),
             "Sparse Transformer strided pattern (Child et al. 2019)"),
    MaskKind("fixed", c.fixed, (Key("stride", "int"), Key("c", "int", 1)),
             "Sparse Transformer fixed pattern (Child et al. 2019)"),
    MaskKind("longformer", c.longformer, (_W_ODD, Key("globals", "ints", ())),
             "window plus global tokens (Beltagy et al. 2020)"),
    MaskKind("bigbird", c.bigbird, (_W_ODD, Key("globals", "ints", ()), Key("random", "int", 0),
                                    Key("seed", "int", 0)),
             "window + globals + random keys (Zaheer et al. 2020)"),
    MaskKind("random", c.random, (Key("p", "float"), Key("seed", "int", 0)),
             "Erdos-Renyi G(N, p) plus self-loops"),
)}
_KEYS = {name: kind.keys for name, kind in MASK_KINDS.items()}


class _Checked:
    """What :func:`check_spec` parses an atom to (nothing is built)."""

    def __and__(self, other: "_Checked") -> "_Checked":
        return self

    __or__ = __and__


def _parse_atom(text: str, n: int | None) -> Any:
    """The mask of one atom on ``n`` tokens; with ``n=None`` only checked (a :class:`_Checked`).
    A file mask's rows are left to :func:`_build`, which checks the composed mask."""
    text = text.strip()
    if not text:
        raise MaskError("empty mask spec (nothing between '&' or '|')")
    if Spec.name_of(text) == "file":
        path = _file_path(text)
        if not path:
            raise MaskError("mask spec 'file:' needs a path, e.g. file:mask.npy")
        if n is not None:
            return c.from_file(path, n, check_rows=False)
        if not Path(path).is_file():
            raise MaskError(f"mask file {path!r} is not a readable file")
        if path.endswith(".npy"):
            _npy_rows(path)
        return _Checked()
    spec = Spec.parse(text, "mask", names=_KEYS, error=MaskError)
    kind = MASK_KINDS[spec.name]
    values = {**{k.name: k.default for k in kind.keys if k.default is not REQUIRED}, **spec.params}
    return _Checked() if n is None else kind.build(n, **values)


def parse_mask(spec: str, n_tokens: int) -> Mask:
    """Build the mask described by ``spec`` (forms: module docstring; names: ``MASK_KINDS``) for
    ``n_tokens`` tokens.

    Raises :class:`MaskError` for ``n_tokens < 1``, an unknown name or key, a missing key, a malformed
    value, unbalanced parentheses, a parameter the constructor rejects, a composition leaving an empty
    row, or a schedule spec (pointing to :func:`~rankcollapse.masks.parse_schedule`);
    :class:`MemoryLimitError` when the rows' first and last keys alone exceed half the memory.

    See Also
    --------
    resolve_mask : a Mask from any mask form (spec, Mask, bool matrix, scipy sparse).
    parse_schedule : one mask per layer (``schedule:...``).
    analyze : the mask's graph: radius, centers, quasi-strong connectivity.

    Examples
    --------
    >>> m = parse_mask("causal_sliding_window:w=2", 4)
    >>> m
    Mask('causal_sliding_window:w=2', n_tokens=4)
    >>> m.to_numpy().astype(int)  # M[i, j] = 1 iff token i attends to token j
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    >>> parse_mask("causal&sliding_window:w=3", 4) == m
    True
    """
    n = check_int(n_tokens, "n_tokens", low=1, error=MaskError) if isinstance(spec, str) else None
    if n is not None:  # the least a mask of N rows holds: the first and last key of each row
        check_edges(n, n, PER_ROW_BYTES)
    return _build(spec, n)


def check_spec(spec: str) -> str:
    """``spec``, checked without building it for any N (names, keys, values, parentheses,
    ``file:`` paths; limits that depend on N are :func:`parse_mask`'s). Raises :class:`MaskError`
    as :func:`parse_mask` would."""
    _build(spec, None)
    return spec


def _build(spec: Any, n: int | None) -> Any:
    """The mask of ``spec`` on ``n`` tokens; with ``n=None`` only checked."""
    if not isinstance(spec, str):
        raise MaskError(f"mask spec must be a string, got {type(spec).__name__}")
    if spec.strip().startswith(("schedule:", "[")):
        raise MaskError(SCHEDULE_HERE.format(spec=spec))
    if spec.strip().startswith("file:") and not any(ch in spec for ch in "&|()"):
        return _rows_checked(_parse_atom(spec, n))  # a lone path may hold any character
    tokens = [t for t in (p.strip() for p in re.split(r"([&|()])", spec)) if t]
    depth = max(itertools.accumulate((t == "(") - (t == ")") for t in tokens), default=0)
    if depth > MAX_NESTING:
        raise MaskError(f"mask spec {excerpt(spec)} nests parentheses {depth} deep; at most {MAX_NESTING}")
    mask, pos = _parse_binary(tokens, 0, n, spec)
    if pos != len(tokens):
        raise MaskError(f"unbalanced parentheses in mask spec {spec!r} (unexpected {tokens[pos]!r})")
    return _rows_checked(mask)


def _rows_checked(mask: Any) -> Any:
    """``mask``, its rows checked if it was built unchecked: a file mask or a composition (a
    named constructor's own mask is checked when built). Attention uses the composed mask, so
    the rule "every row allows a key" is the whole's, not each part's."""
    if isinstance(mask, Mask) and mask.is_built:  # O(N) on the built CSR
        check_rows_allow_key(mask.to_csr(), mask.spec)
    return mask


def spec_n_tokens(spec: str) -> int | None:
    """The N that ``spec`` fixes (only a ``.npy`` mask file does, read from its header), or None;
    schedules are not read. Raises :class:`MaskError` for an unreadable ``.npy`` file or two of
    different N."""
    if not isinstance(spec, str) or spec.strip().startswith(("schedule:", "[")):
        return None
    sizes = {path: _npy_rows(path) for path in spec_files(spec) if path.endswith(".npy")}
    if len(set(sizes.values())) > 1:
        raise MaskError(f"mask files of different sizes: {', '.join(f'{p} (N={n})' for p, n in sizes.items())}")
    return next(iter(sizes.values()), None)


def spec_files(spec: str) -> list[str]:
    """Paths of the ``file:`` masks of the mask spec ``spec``, in order (a lone ``file:PATH`` is one atom)."""
    if not isinstance(spec, str):
        return []
    lone = spec.strip().startswith("file:") and not any(ch in spec for ch in "&|()")
    atoms = [spec.strip()] if lone else [t.strip() for t in re.split(r"[&|()]", spec) if t.strip()]
    return [_file_path(atom) for atom in atoms if Spec.name_of(atom) == "file"]


def _file_path(atom: str) -> str:
    """``PATH`` of the atom ``file:PATH`` (a path may hold ``:``, ``,`` and ``=``)."""
    return atom.partition(":")[2].strip()


def _npy_rows(path: str) -> int:
    """Rows of the square matrix in the ``.npy`` file ``path`` (memory-mapped header)."""
    try:
        shape = np.load(path, mmap_mode="r", allow_pickle=False).shape
    except Exception:  # noqa: BLE001 - the one loader names what is wrong
        shape = None
    if shape is None or len(shape) != 2 or shape[0] != shape[1] or shape[0] < 1:
        c.from_file(path, 1)  # raises the loader's message (missing, empty, pickles, not square...)
        raise MaskError(f"mask file {path!r} does not hold a square (N, N) matrix")
    return int(shape[0])


_OPS = ("&", "|", "(", ")")
#: Bytes per query row that any mask holds, built or not: its first and last key (int64).
PER_ROW_BYTES = 16
#: Deepest nesting of parentheses a spec may have (the parser recurses once per level).
MAX_NESTING = 64

#: The one message for a schedule where a single mask is parsed.
SCHEDULE_HERE = (
    "{spec!r} is a mask schedule (one mask per layer) and one mask is needed here; schedules are taken by "
    "simulate, probe, theory bound and mask describe/show/compare, and in Python by "
    "rankcollapse.masks.parse_schedule(spec, n_tokens) (single masks too; .composed() is the one-period graph)")


# Recursive descent: union := intersection ('|' intersection)*;
# intersection := operand ('&' operand)*; operand := '(' union ')' | atom.
def _parse_binary(tokens: list[str], pos: int, n: int | None, spec: str, op: str = "|") -> tuple[Any, int]:
    """A union (``op="|"``) or an intersection (``op="&"``) from ``tokens[pos]`` on."""
    def operand(at: int) -> tuple[Any, int]:
        return _parse_binary(tokens, at, n, spec, "&") if op == "|" else _parse_operand(tokens, at, n, spec)

    mask, pos = operand(pos)
    while pos < len(tokens) and tokens[pos] == op:
        other, pos = operand(pos + 1)
        mask = mask & other if n is None else combine(mask, other, op, check_rows=False)  # checked whole
    return mask, pos


def _parse_operand(tokens: list[str], pos: int, n: int | None, spec: str) -> tuple[Any, int]:
    if pos < len(tokens) and tokens[pos] == "(":
        mask, pos = _parse_binary(tokens, pos + 1, n, spec)
        if pos >= len(tokens) or tokens[pos] != ")":
            raise MaskError(f"unbalanced parentheses in mask spec {spec!r} (missing ')')")
        return mask, pos + 1
    if pos >= len(tokens) or tokens[pos] in _OPS:
        raise MaskError(f"empty mask spec (nothing between '&', '|' or parentheses) in {spec!r}")
    return _parse_atom(tokens[pos], n), pos + 1
