"""Units of work, the registry of unit kinds, and everything that enters a unit's key
(docs/sweeps.md, "What a unit is"): kind, parameters, the kind's version and the code
fingerprint (:func:`code_fingerprint`).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any, Callable

from .._io import config_hash
from ..errors import ConfigError
from .progress import cost_class

if TYPE_CHECKING:
    import pandas as pd

#: Declared version of the package's numerics: bumped when a change alters the numbers any unit
#: produces, kept otherwise (one kind's change bumps that kind's ``version`` instead).
NUMERICS_VERSION = 3
#: Libraries whose version can change a unit's numbers.
NUMERIC_LIBRARIES = ("torch", "numpy", "scipy", "networkx", "transformers", "tokenizers", "safetensors")

#: Parameters a unit's default label shows (when the unit has them), in this order.
LABEL_KEYS = ("model", "mask", "variant", "value", "d_qk", "check", "setting", "seed")
#: Order of further parameters when they tell units apart (the rest follow, sorted).
_LABEL_ORDER = LABEL_KEYS[:3] + ("norm", "sphere_radius", "init_scale", "drop") + LABEL_KEYS[3:]


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The part of every unit's key that stands for the code: SHA-256 (12 hex digits) of
    :func:`numerics_key`; not a hash of the source, nor of the device (docs/sweeps.md, "Cache")."""
    return config_hash(numerics_key())


def numerics_key() -> dict[str, Any]:
    """What :func:`code_fingerprint` hashes: ``{"numerics": N, "torch": "2.x", ...}``."""
    out: dict[str, Any] = {"numerics": NUMERICS_VERSION}
    for name in NUMERIC_LIBRARIES:
        try:
            out[name] = metadata.version(name).split("+")[0]  # "+cpu" names the build, not the numerics
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass(frozen=True)
class Unit:
    """One cacheable unit of work: a registered ``kind`` plus the parameters that fix its
    numbers; ``experiment`` names the experiment that planned it (not in the key).
    :attr:`hash` and :attr:`label` raise ``ConfigError`` for an unregistered kind."""

    kind: str
    params: dict[str, Any] = field(hash=False)
    experiment: str = ""

    @property
    def hash(self) -> str:
        """The cache key: 12 hex digits of SHA-256 over kind, parameters, version, code fingerprint."""
        kind = unit_kind(self.kind)
        params = self.params if kind.key_params is None else kind.key_params(self.params)
        return config_hash({"kind": self.kind, "params": params, "v": kind.version, "code": code_fingerprint()})

    @property
    def label(self) -> str:
        """The kind's label of this unit; by default ``kind[model=..., mask=..., ...]`` (:data:`LABEL_KEYS`)."""
        label = unit_kind(self.kind).label
        return label(self) if label is not None else params_label(self, LABEL_KEYS)


#: A unit kind's function: ``run(unit, ctx) -> frame`` (``ctx``: the run context, :mod:`.context`).
UnitFn = Callable[[Unit, Any], "pd.DataFrame"]


@dataclass(frozen=True)
class UnitKind:
    """A registry entry: how units of kind ``name`` are computed, versioned and labelled.

    Attributes
    ----------
    run : ``run(unit, ctx) -> pandas.DataFrame``, a module-level function (sent by reference).
    version : bumped when a change alters the labels or numbers of this kind's units.
    label : ``label(unit) -> str``; None: :func:`params_label`.
    group : who plans these units (an experiment config names only group ``"experiments"``).
    key_params : ``key_params(params) -> dict``, the parameters as the key hashes them; None: as they are.
    """

    name: str
    run: UnitFn
    version: int
    label: Callable[[Unit], str] | None = None
    group: str = ""
    key_params: Callable[[dict[str, Any]], dict[str, Any]] | None = None


_KINDS: dict[str, UnitKind] = {}
#: The module whose import registers each group's kinds, imported on demand (a lookup of a kind
#: not registered yet, a listing): a kind resolves in a fresh process, and importing the package
#: imports none of them. Named here as text: the sweep engine lies below those layers.
KIND_MODULES = {"experiments": "rankcollapse.experiments.schema", "phase": "rankcollapse.phase.sweep"}


def _load_kinds(group: str | None = None) -> None:
    """Import the :data:`KIND_MODULES` of ``group`` (all when None); a no-op once imported."""
    for name, module in KIND_MODULES.items():
        if group is None or name == group:
            importlib.import_module(module)


def register_unit_kind(name: str, run: UnitFn, *, version: int, label: Callable[[Unit], str] | None = None,
                       group: str = "", key_params: Callable[[dict[str, Any]], dict[str, Any]] | None = None
                       ) -> UnitKind:
    """Register the unit kind ``name`` (:class:`UnitKind`); returns the entry (the first one when
    the same entry is registered again). Raises ``ConfigError``: ``name`` already registered with
    another function, version, label or group, or a ``version`` that is not an integer >= 0."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ConfigError(f"unit kind {name!r}: version must be an integer >= 0, got {version!r}")
    entry = UnitKind(name, run, version, label, group, key_params)
    old = _KINDS.get(name)
    if old is not None:
        if _identity(old) != _identity(entry):
            raise ConfigError(f"unit kind {name!r} is already registered (by {_where(old.run)}, version {old.version})")
        return old
    _KINDS[name] = entry
    return entry


def _where(fn: Callable | None) -> str | None:
    return None if fn is None else f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _identity(kind: UnitKind) -> tuple:
    # functions by qualified name: a module imported twice makes new function objects
    return _where(kind.run), kind.version, _where(kind.label), kind.group, _where(kind.key_params)


def unit_kind(name: str) -> UnitKind:
    """The registry entry of ``name`` (``ConfigError`` naming the registered kinds if none); a
    kind not registered yet is looked for in :data:`KIND_MODULES`, imported then."""
    if name not in _KINDS:
        _load_kinds()
    try:
        return _KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown unit kind {name!r}; registered: {', '.join(sorted(_KINDS)) or 'none'}") from None


def unit_kinds(group: str | None = None) -> tuple[str, ...]:
    """Names of the registered kinds (of ``group`` only, when given), in registration order, the
    :data:`KIND_MODULES` of ``group`` (all when None) imported first."""
    _load_kinds(group)
    return tuple(k for k, v in _KINDS.items() if group is None or v.group == group)


def unit_functions(units: list[Unit]) -> dict[str, UnitFn]:
    """``{kind: run}`` of the kinds of ``units`` (``ConfigError`` for an unregistered kind)."""
    return {kind: unit_kind(kind).run for kind in dict.fromkeys(u.kind for u in units)}


def params_label(unit: Unit, keys: tuple[str, ...] | list[str]) -> str:
    """``kind[k=v, ...]`` over the ``keys`` that ``unit`` has (empty, None, ``default`` and ``seed=-1`` left out)."""
    p = unit.params
    bits = [f"{k}={_label_value(p[k])}" for k in keys
            if k in p and p[k] not in ("", None, "default") and not (k == "seed" and p[k] == -1)]
    return f"{unit.kind}[{', '.join(bits)}]"


def _label_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_label_value(x) for x in v) + "]"
    return str(v)


def unit_labels(units: list[Unit]) -> dict[str, str]:
    """``{hash: label}``: each unit's :attr:`Unit.label` plus every parameter that differs between
    units sharing it; a label that would still collide ends with the unit's hash."""
    groups: dict[str, dict[str, Unit]] = {}
    for u in units:
        groups.setdefault(u.label, {})[u.hash] = u
    out: dict[str, str] = {}
    for base, members in groups.items():
        if len(members) == 1:
            out.update({h: base for h in members})
            continue
        keys = {k for u in members.values() for k in u.params if k != "data"}
        differ = {k for k in keys if len({repr(u.params.get(k)) for u in members.values()}) > 1}
        order = [k for k in _LABEL_ORDER if k in differ or k in LABEL_KEYS] + sorted(differ - set(_LABEL_ORDER))
        labels = {h: params_label(u, order) for h, u in members.items()}
        clash = {lab for lab in labels.values() if list(labels.values()).count(lab) > 1}
        out.update({h: (lab[:-1] + f", unit={h}]" if lab in clash else lab) for h, lab in labels.items()})
    return out


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based) of a run's units, computed into a shared cache.

    The partition depends on the unit keys and estimated costs only, so every shard agrees
    on it: the units, most expensive first (then by cost class and key), each go to the
    shard with the least cost so far (lowest index on a tie).

    >>> Shard.parse("2/3")
    Shard(index=2, count=3)
    >>> str(Shard(1, 2))
    '1/2'
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (self.index, self.count))
        if not ok or self.count < 1 or not 1 <= self.index <= self.count:
            raise ConfigError(f"must be I/K with 1 <= I <= K, got {self.index!r}/{self.count!r}", argument="shard")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, spec: "str | Shard") -> "Shard":
        """``"I/K"`` (or a :class:`Shard`) as a :class:`Shard` (``ConfigError``, argument ``shard``, otherwise)."""
        if isinstance(spec, Shard):
            return spec
        parts = str(spec).strip().split("/")
        if len(parts) != 2 or not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
            raise ConfigError(f"must be I/K (shard I of K, e.g. 1/4), got {str(spec)[:40]!r}", argument="shard")
        return cls(int(parts[0]), int(parts[1]))

    def select(self, units: list[Unit], cost: Callable[[Unit], float] | None = None) -> list[Unit]:
        """The units of this shard, in the order of ``units``, each once; ``cost``: a unit's estimate (default 1)."""
        distinct = list({u.hash: u for u in units}.values())
        price = {u.hash: float(cost(u)) if cost is not None else 1.0 for u in distinct}
        ranked = sorted(distinct, key=lambda u: (-price[u.hash], cost_class(u), u.hash))
        loads = [0.0] * min(self.count, len(distinct))  # shards past the units' count stay empty
        mine = set()
        for u in ranked:
            k = loads.index(min(loads))
            loads[k] += price[u.hash]
            if k == self.index - 1:
                mine.add(u.hash)
        return [u for u in distinct if u.hash in mine]
