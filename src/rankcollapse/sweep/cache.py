"""The unit cache: one Parquet file per unit, named by kind and hash (docs/sweeps.md, "Cache"),
with its compute cost, its unit's key and page checksums; an entry that does not verify is set
aside and recomputed. Files are written to a temporary name and renamed: many writers are safe.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .._io import TMP_SUFFIX, atomic_path, read_regular
from .units import Unit

ORPHAN_AGE_S = 24 * 3600  # seconds after which a temporary file belongs to a dead writer
COST_KEY = b"rankcollapse.cost"  # Parquet metadata keys: an entry's compute cost,
UNIT_KEY = b"rankcollapse.key"  # the unit it holds ({"kind": ..., "hash": ...})


class CacheEntryError(Exception):
    """A cache entry that does not verify (set aside, never raised to the caller)."""


@dataclass
class UnitCache:
    """Read and write unit results under ``root`` (created on first write); ``recompute``:
    compute each unit of this run once, ignoring and overwriting its existing entry."""

    root: Path
    recompute: bool = False
    _fresh: set[str] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def path(self, unit: Unit) -> Path:
        """``<root>/<kind>-<hash>.parquet``."""
        return self.root / f"{unit.kind}-{unit.hash}.parquet"

    def has(self, unit: Unit) -> bool:
        """Whether ``unit`` can be read instead of computed."""
        return not (self.recompute and unit.hash not in self._fresh) and self.path(unit).exists()

    def get(self, unit: Unit) -> pd.DataFrame | None:
        """The stored frame of ``unit``, or ``None`` when it must be computed."""
        if not self.has(unit):
            return None
        path = self.path(unit)
        try:
            return self._verified(unit, read_regular(path, "cache entry"))
        except FileNotFoundError:  # removed by someone else between the check and the read
            return None
        except Exception as exc:  # a link, a folder, truncated or foreign bytes: never trusted
            self._set_aside(path, exc)
            return None

    @staticmethod
    def _verified(unit: Unit, data: bytes) -> pd.DataFrame:
        import pyarrow.parquet as pq

        meta = pq.read_schema(io.BytesIO(data)).metadata or {}
        try:
            key = json.loads(meta[UNIT_KEY])
        except (KeyError, ValueError):
            raise CacheEntryError("it names no unit (written by an earlier version or not by this toolkit)") from None
        if key != {"kind": unit.kind, "hash": unit.hash}:
            raise CacheEntryError(f"it holds another unit ({key.get('kind')}-{key.get('hash')})"
                                  if isinstance(key, dict) else "its unit key is malformed")
        return pd.read_parquet(io.BytesIO(data), page_checksum_verification=True)

    def _set_aside(self, path: Path, exc: Exception) -> None:
        """Rename an untrusted entry (a link itself, not its target) to ``<name>.rejected-<time>``; say so."""
        aside = path.with_name(f"{path.name}.rejected-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(path, aside)
        except OSError:
            aside = None
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        where = f"; moved to {aside.name}" if aside else ""
        print(f"rankcollapse: warning: cache entry {path.name} is unreadable ({why}){where}; "
              "recomputing it", file=sys.stderr, flush=True)

    def put(self, unit: Unit, frame: pd.DataFrame, cost: dict[str, Any] | None = None) -> Path:
        """Store ``frame`` atomically with its JSON-able compute ``cost`` (``{"seconds": ...,
        "cpu_seconds": ..., "worker": "host:pid"}``) in its metadata; returns the path."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.path(unit)
        table = pa.Table.from_pandas(frame, preserve_index=False)
        meta = dict(table.schema.metadata or {})
        meta[UNIT_KEY] = json.dumps({"kind": unit.kind, "hash": unit.hash}).encode()
        if cost is not None:
            meta[COST_KEY] = json.dumps(cost).encode()
        table = table.replace_schema_metadata(meta)
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, write_page_checksum=True)
        self._fresh.add(unit.hash)
        return path

    def cost(self, unit: Unit) -> dict[str, Any] | None:
        """The ``cost`` :meth:`put` stored with ``unit``'s entry; None without one."""
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(io.BytesIO(read_regular(self.path(unit), "cache entry"))).metadata or {}
        except (OSError, ValueError):  # missing, a link (UnsafePathError) or not Parquet
            return None
        raw = meta.get(COST_KEY)
        return json.loads(raw) if raw else None

    def remove_orphans(self, max_age_s: float = ORPHAN_AGE_S) -> int:
        """Delete temporary files older than ``max_age_s`` (of dead writers); returns how many."""
        if not self.root.is_dir():
            return 0
        now, n = time.time(), 0
        for tmp in self.root.glob(f".*{TMP_SUFFIX}"):  # ours only: a user's .notes.tmp stays
            try:
                if now - tmp.stat().st_mtime > max_age_s:
                    tmp.unlink()
                    n += 1
            except FileNotFoundError:
                pass
        return n
