"""The unit cache: one Parquet file per unit, named by the unit's kind and hash.

The hash (:attr:`~.units.Unit.hash`) covers the unit's parameters, its data spec, its
kind's version, the declared numerics version and the versions of the libraries that
change numbers (:func:`~.units.code_fingerprint`), so a file's name says what it holds
(content addressing by key). The cache stores whatever frame a unit returns, per-window
rows included; it never interprets them.

Each entry also keeps what computing it cost (:meth:`UnitCache.cost`: wall and CPU
seconds measured where the unit ran, the worker, when), in the Parquet file's own
metadata, so a rerun that reads the entry still reports what the numbers took to
compute. Entries written by earlier versions have no cost (``None``).

Each entry verifies itself: its metadata names the unit it holds (``rankcollapse.key``:
kind and hash) and every data page carries a CRC checksum (Parquet's
``write_page_checksum``), checked on every read. An entry that does not verify (another
unit's file under this name, flipped bits, a truncated or foreign file, an entry of an
earlier version without a key, a link or a folder) is renamed aside with one warning line
and the unit is computed again, so a table never silently mixes in a foreign entry.

Safe for many writers (processes of one machine, or the nodes of a cluster sharing the
folder over NFS): a file is written to a temporary name in the same folder and renamed
with ``os.replace``, so a reader sees either nothing or a whole file, and two writers of
the same unit write the same bytes.
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

#: Temporary files older than this (seconds) belong to a dead writer and may be removed.
ORPHAN_AGE_S = 24 * 3600
#: Parquet metadata key of an entry's compute cost.
COST_KEY = b"rankcollapse.cost"
#: Parquet metadata key naming the unit an entry holds (``{"kind": ..., "hash": ...}``).
UNIT_KEY = b"rankcollapse.key"


class CacheEntryError(Exception):
    """A cache entry that does not verify (internal: the entry is set aside, never raised
    to the caller)."""


@dataclass
class UnitCache:
    """Read and write unit results under ``root``.

    Parameters
    ----------
    root : the cache folder (created on first write).
    recompute : ignore existing entries of the units of this run and overwrite them;
        each unit is recomputed once per run even when several groups ask for it.
    """

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
        if self.recompute and unit.hash not in self._fresh:
            return False
        return self.path(unit).exists()

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
        """The frame stored in ``data`` if it names ``unit`` and its page checksums hold."""
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
        """Rename an entry that cannot be trusted to ``<name>.rejected-<time>`` (the link
        itself when it is a link: its target is never touched) and say so on one line;
        the unit is then computed again."""
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
        """Store ``frame`` atomically (temporary file + ``os.replace``) with its compute
        ``cost`` (JSON-able, e.g. ``{"seconds": 12.3, "cpu_seconds": 11.9, "worker":
        "host:pid"}``) in the file's metadata; returns the path."""
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
        """What computing the stored entry of ``unit`` cost (as given to :meth:`put`);
        ``None`` for an entry without it or no entry."""
        import pyarrow.parquet as pq

        try:
            meta = pq.read_schema(io.BytesIO(read_regular(self.path(unit), "cache entry"))).metadata or {}
        except (OSError, ValueError):  # missing, a link (UnsafePathError) or not Parquet
            return None
        raw = meta.get(COST_KEY)
        return json.loads(raw) if raw else None

    def remove_orphans(self, max_age_s: float = ORPHAN_AGE_S) -> int:
        """Delete temporary files of writers that died more than ``max_age_s`` ago
        (a live writer's file is younger); returns how many were removed."""
        if not self.root.is_dir():
            return 0
        now, n = time.time(), 0
        for tmp in self.root.glob(f".*{TMP_SUFFIX}"):  # only ours: a user's .notes.tmp stays
            try:
                if now - tmp.stat().st_mtime > max_age_s:
                    tmp.unlink()
                    n += 1
            except FileNotFoundError:
                pass
        return n


def as_cache(cache: Path | str | UnitCache) -> UnitCache:
    """A :class:`UnitCache` for a folder (callers may pass either)."""
    return cache if isinstance(cache, UnitCache) else UnitCache(Path(cache))


__all__ = ["UnitCache", "as_cache", "ORPHAN_AGE_S"]
