"""Atomic writes, config hashes and version records."""

import json
import os
import stat

import pytest

from rankcollapse._io import atomic_path, config_hash, versions, write_json_atomic


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("boom")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_has_normal_permissions(tmp_path):
    target = tmp_path / "sub" / "x.json"
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    mode = stat.S_IMODE(os.stat(target).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask


def test_config_hash_is_order_independent_and_sensitive():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    assert len(config_hash({"a": 1})) == 12


def test_versions_record_the_numeric_stack():
    v = versions()
    assert v["torch"].startswith("2.") and v["rankcollapse"] != "not installed"


def test_code_fingerprint_is_stable_within_a_process():
    from rankcollapse.sweep.units import code_fingerprint

    assert code_fingerprint() == code_fingerprint() and len(code_fingerprint()) == 12
