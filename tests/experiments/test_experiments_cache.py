"""The unit cache verifies each entry: its own key and page checksums."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep.units import Unit


def _frame(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"layer": np.arange(200), "mean": rng.standard_normal(200), "metric": ["mu"] * 200})


A = Unit("simulate", {"mask": "complete", "seed": 0})
B = Unit("simulate", {"mask": "causal", "seed": 0})


def _rejected(cache: UnitCache, unit: Unit) -> list:
    return [p for p in cache.root.iterdir() if p.name.startswith(cache.path(unit).name + ".rejected-")]


def test_a_verified_entry_reads_back_exactly_with_its_cost(tmp_path):
    cache = UnitCache(tmp_path)
    cache.put(A, _frame(0), {"seconds": 1.5})
    pd.testing.assert_frame_equal(cache.get(A), _frame(0))
    assert cache.cost(A) == {"seconds": 1.5}
    assert not _rejected(cache, A)


def test_another_units_entry_under_this_name_is_set_aside(tmp_path, capsys):
    cache = UnitCache(tmp_path)
    cache.put(B, _frame(1))
    cache.path(A).write_bytes(cache.path(B).read_bytes())  # a foreign entry under A's name
    assert cache.get(A) is None
    err = capsys.readouterr().err
    assert "another unit" in err and B.hash in err and len(err.strip().splitlines()) == 1
    assert _rejected(cache, A) and not cache.path(A).exists()
    pd.testing.assert_frame_equal(cache.get(B), _frame(1))  # the real owner is untouched


def test_flipped_bits_in_a_data_page_are_caught(tmp_path, capsys):
    cache = UnitCache(tmp_path)
    cache.put(A, _frame(2))
    raw = bytearray(cache.path(A).read_bytes())
    raw[len(raw) // 3] ^= 0x40  # inside the data pages, far from the footer
    cache.path(A).write_bytes(bytes(raw))
    assert cache.get(A) is None
    assert "recomputing" in capsys.readouterr().err
    assert _rejected(cache, A)


def test_an_entry_without_a_key_is_not_trusted(tmp_path, capsys):
    cache = UnitCache(tmp_path)
    _frame(3).to_parquet(cache.path(A), index=False)  # as an earlier version wrote it
    assert cache.get(A) is None
    assert "names no unit" in capsys.readouterr().err


@pytest.mark.parametrize("flip", [False, True])
def test_a_run_recomputes_a_set_aside_entry(tmp_path, flip):
    cache = UnitCache(tmp_path)
    cache.put(A, _frame(4))
    if flip:
        cache.path(A).write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    got = cache.get(A)
    assert (got is None) == flip
    if flip:
        cache.put(A, _frame(4))
        pd.testing.assert_frame_equal(cache.get(A), _frame(4))
