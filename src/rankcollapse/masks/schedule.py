"""Mask schedules: layer ``t`` uses mask ``t mod period`` (docs/schedules.md). Forms:
``schedule:MASK*k,MASK,...`` (an item ``key=value`` continues the previous mask spec); a YAML/JSON
list string, or ``schedule:PATH`` of a ``.yaml/.yml/.json`` file holding one (items may be
``{mask: SPEC, repeat: k}``); a Python list of specs / :class:`Mask`.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from .._io import file_sha256, read_user_text
from ..errors import MaskError, excerpt
from . import interval_graph
from .mask import Mask
from .spec import parse_mask, spec_files

PREFIX = "schedule:"
_REPEAT = re.compile(r"^(.*?)\s*\*\s*(\d+)\s*$", re.S)
_CONTINUATION = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*=")

#: The most layers one period may hold, counted from the repeat counts before any list is expanded.
MAX_PERIOD = 4096


def is_schedule(source: Any) -> bool:
    """Whether ``source`` is a schedule (spec string, list string, list or MaskSchedule)."""
    if isinstance(source, MaskSchedule):
        return True
    if isinstance(source, str):
        s = source.strip()
        return s.startswith(PREFIX) or s.startswith("[")
    # a list of specs / Masks / {mask, repeat} items (not a nested bool matrix)
    return isinstance(source, (list, tuple)) and len(source) > 0 and all(
        isinstance(x, (str, Mask, dict)) for x in source)


def mask_files(source: Any) -> list[str]:
    """Paths of the files the mask or schedule spec ``source`` reads, in order (a schedule's
    list file and every ``file:`` mask). Raises :class:`MaskError` for an unreadable schedule list."""
    if not isinstance(source, str):
        return []
    if not is_schedule(source):
        return spec_files(source)
    s = source.strip()
    body = s[len(PREFIX):].strip() if s.startswith(PREFIX) else s
    listed = [body] if body.endswith((".yaml", ".yml", ".json")) and Path(body).is_file() else []
    items = [_runs(item)[0] for item in _items(source)]
    return listed + [f for item in items if isinstance(item, str) for f in spec_files(item)]


def mask_digests(source: Any) -> list[str]:
    """SHA-256 (16 hex digits) of each file of :func:`mask_files`; MaskError if one cannot be read."""
    out = []
    for path in mask_files(source):
        try:
            out.append(file_sha256(path)[:16])
        except OSError as exc:
            raise MaskError(f"cannot read mask file {path!r}: {exc.strerror or exc}") from None
    return out


def _split_items(body: str) -> list[str]:
    """Comma-separated items, with ``key=value`` items joined to the mask before them."""
    items: list[str] = []
    for raw in body.split(","):
        if items and _CONTINUATION.match(raw) and ":" not in raw.split("=", 1)[0]:
            items[-1] += "," + raw.strip()
        else:
            items.append(raw.strip())
    return items


def _repeat(k: Any, label: str) -> int:
    """A repeat count ``1 <= k <= MAX_PERIOD`` of the item ``label`` (a spec, never ``str()`` of YAML)."""
    item = excerpt(label)
    if isinstance(k, str) and k.isdigit():
        if len(k) > 18:  # never convert a 5000-digit string
            raise MaskError(f"schedule item {item}: a repeat count of {len(k)} digits exceeds the "
                            f"longest period, {MAX_PERIOD} layers")
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        got = excerpt(k) if isinstance(k, (str, int, float)) else type(k).__name__
        raise MaskError(f"schedule item {item}: repeat count must be an integer >= 1, got {got}")
    if k > MAX_PERIOD:
        raise MaskError(f"schedule item {item}: repeat count {k} exceeds the longest period, {MAX_PERIOD} layers")
    return k


def _runs(item: Any) -> tuple[Any, int]:
    """One list element -> ``(mask, repeat count)`` (``"SPEC*k"``, ``{mask, repeat}``, Mask)."""
    if isinstance(item, Mask):
        return item, 1
    if isinstance(item, dict):
        extra = [excerpt(key) for key in item if key not in ("mask", "repeat")]
        if extra:
            raise MaskError(f"schedule items take the keys 'mask' and 'repeat', got {', '.join(extra[:5])}")
        if not isinstance(item.get("mask"), str):  # never str() a YAML structure
            raise MaskError("schedule items {mask: SPEC, repeat: k} need 'mask' to be a mask spec string")
        return item["mask"], _repeat(item.get("repeat", 1), item["mask"])
    if not isinstance(item, str):
        raise MaskError(f"schedule items must be mask specs, got {type(item).__name__}")
    m = _REPEAT.match(item)
    if not m:
        return item.strip(), 1
    return m.group(1).strip(), _repeat(m.group(2), item)


def _expand_all(items: list[Any]) -> list[Any]:
    """Every layer of the period, its length checked from the counts first."""
    runs = [_runs(item) for item in items]
    period = sum(k for _, k in runs)
    if period > MAX_PERIOD:
        raise MaskError(f"the schedule's period is {period} layers, more than the longest allowed, "
                        f"{MAX_PERIOD}; write one period of the pattern (a schedule repeats itself)")
    return [one for one, k in runs for _ in range(k)]


def _items(source: Any) -> list[Any]:
    if isinstance(source, (list, tuple)):
        return list(source)
    if not isinstance(source, str):
        raise MaskError(f"a schedule is a spec string, a list of specs or a Mask, got {type(source).__name__}")
    s = source.strip()
    body = s[len(PREFIX):].strip() if s.startswith(PREFIX) else s
    if body.endswith((".yaml", ".yml", ".json")) and Path(body).is_file():
        body = read_user_text(body, "schedule file", MaskError)
    if body.lstrip().startswith("[") or "\n" in body:
        import yaml

        try:
            data = yaml.load(body, Loader=_unique_keys_loader())  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            raise MaskError(f"schedule list is not valid YAML/JSON{at}: "
                            f"{excerpt(getattr(exc, 'problem', None) or exc, limit=80)}") from None
        except RecursionError:
            raise MaskError("schedule list is nested too deeply to be a list of masks") from None
        if not isinstance(data, list):
            raise MaskError(f"a schedule file or list string must hold a list, got {type(data).__name__}")
        return data
    return _split_items(body)


def _unique_keys_loader() -> type:
    """PyYAML's ``SafeLoader`` refusing a key given twice in one mapping."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice",
                                                            key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


class MaskSchedule:
    """A periodic schedule of ``masks`` (one :class:`Mask` per layer of the period) on ``n_tokens``
    tokens; ``spec`` is canonical, ``schedule:A*k,B``."""

    def __init__(self, masks: Sequence[Mask], spec: str | None = None):
        if not masks:
            raise MaskError("a schedule needs at least one mask")
        n = {m.n_tokens for m in masks}
        if len(n) != 1:
            raise MaskError(f"schedule masks have different numbers of tokens {sorted(n)}")
        self.masks = list(masks)
        self.n_tokens = n.pop()
        self.spec = spec or canonical_spec([m.spec for m in self.masks])

    @property
    def period(self) -> int:
        return len(self.masks)

    def layer(self, t: int) -> Mask:
        """Mask of layer ``t`` (0-based): ``masks[t mod period]``."""
        return self.masks[t % self.period]

    def edges_per_layer(self) -> list[int]:
        """Attended ``(query, key)`` pairs of each layer of the period."""
        return [int(m.to_csr().nnz) for m in self.masks]

    def mean_edges(self) -> float:
        """Mean attended pairs per layer (the attention budget)."""
        return float(np.mean(self.edges_per_layer()))

    def composed(self) -> Mask:
        """The composed graph of one period, boolean ``M_{p-1} ... M_0`` (docs/theory.md §7), as a
        :class:`Mask`: from intervals in O(N) per layer when every layer has them, else sparse
        boolean products."""
        iv = self.intervals()
        if iv is not None:
            prod_iv = iv[0]
            for layer in iv[1:]:
                prod_iv = interval_graph.compose(layer, prod_iv)
            return Mask(self.n_tokens, f"composed({self.spec})", intervals=prod_iv)
        prod = sp.csr_array(self.masks[0].to_csr(), dtype=bool)
        for m in self.masks[1:]:
            prod = sp.csr_array(m.to_csr(), dtype=bool) @ prod
        return Mask(self.n_tokens, f"composed({self.spec})", csr=prod)

    def intervals(self) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Each layer's ``(lo, hi)`` when every layer is a monotone interval mask, else None."""
        ivs = [m.intervals for m in self.masks]
        return ivs if all(iv is not None and interval_graph.is_monotone_interval(*iv) for iv in ivs) else None

    def __repr__(self) -> str:
        return f"MaskSchedule({self.spec!r}, n_tokens={self.n_tokens})"


def canonical_spec(specs: Sequence[str]) -> str:
    """``schedule:A*k,B`` from per-layer specs (consecutive equal specs folded)."""
    runs = [(spec, len(list(run))) for spec, run in itertools.groupby(specs)]
    return PREFIX + ",".join(spec if k == 1 else f"{spec}*{k}" for spec, k in runs)


def schedule_or_mask(source: Any, n_tokens: int) -> Any:
    """The :class:`MaskSchedule` of ``source`` on ``n_tokens`` tokens when it is a schedule, else
    ``source`` itself. Raises :class:`MaskError` as :func:`parse_schedule`."""
    return parse_schedule(source, n_tokens) if is_schedule(source) else source


def parse_schedule(source: Any, n_tokens: int) -> MaskSchedule:
    """The schedule ``source`` (forms: module docstring; a mask is a period-1 schedule) on
    ``n_tokens`` tokens. Raises :class:`MaskError` for: not a spec, list or Mask; an empty schedule;
    a repeat count < 1 or a period longer than :data:`MAX_PERIOD`; a layer with ``N != n_tokens``;
    an unreadable or non-UTF-8 file; invalid YAML/JSON; a :func:`parse_mask` error (naming the item).
    """
    if isinstance(source, MaskSchedule):
        if source.n_tokens != n_tokens:
            raise MaskError(f"schedule is for N={source.n_tokens} tokens, not {n_tokens}")
        return source
    if isinstance(source, Mask):
        return MaskSchedule([_same_n(source, n_tokens)])
    if isinstance(source, str) and not is_schedule(source):
        return MaskSchedule([parse_mask(source, n_tokens)])
    masks: list[Mask] = []
    cache: dict[str, Mask] = {}
    for one in _expand_all(_items(source)):
        if isinstance(one, Mask):
            masks.append(_same_n(one, n_tokens))
            continue
        if not one:
            raise MaskError(f"empty mask in schedule {excerpt(source)}")
        if one not in cache:
            try:
                cache[one] = _same_n(parse_mask(one, n_tokens), n_tokens)
            except MaskError as exc:
                raise MaskError(f"schedule item {excerpt(one)}: {exc}") from None
        masks.append(cache[one])
    return MaskSchedule(masks)


def _same_n(mask: Mask, n: int) -> Mask:
    """``mask``, refused unless it is on ``n`` tokens."""
    if mask.n_tokens != n:
        raise MaskError(f"schedule layer {mask.spec!r} is on N={mask.n_tokens} tokens, not the schedule's N={n}")
    return mask

