"""Planted links and foreign files: the toolkit never writes through a link it did not
create, never reads a record that is not a regular file of its folder, and never
echoes a file's content in an error."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from rankcollapse._io import open_private, read_regular
from rankcollapse.cli._boundary import MAX_LINE, CliError
from rankcollapse.errors import ModelError, UnsafePathError, excerpt
from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep.units import Unit
from rankcollapse._outdir import LOCK_NAME, OutputFolder, owner

from ._harness import invoke

SECRET = "API_TOKEN=hunter2-very-secret-value-that-must-not-leak"


@pytest.fixture()
def victim(tmp_path):
    """A file standing for a system file that a planted link points at."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, victim):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_NAME).symlink_to(victim)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        with OutputFolder(out):
            pass
    assert victim.read_text() == "precious\n"
    assert owner(out) == {}  # the link is not read either


def test_a_fifo_lock_is_refused_without_waiting(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / LOCK_NAME)
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_private(out / LOCK_NAME, "lock file")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read_regular(out / LOCK_NAME, "lock file")


def test_a_normal_lock_still_records_its_owner(tmp_path):
    with OutputFolder(tmp_path / "run"):
        info = owner(tmp_path / "run")
    assert info["pid"] == os.getpid()


def _unit() -> Unit:
    import rankcollapse.experiments  # noqa: F401  registers the "simulate" unit kind the key reads

    return Unit("simulate", {"mask": "complete", "seed": 0})


@pytest.mark.parametrize("plant", ["link", "garbage", "folder", "truncated"])
def test_an_untrusted_cache_entry_is_set_aside_and_recomputed(tmp_path, victim, capsys, plant):
    cache = UnitCache(tmp_path / "cache")
    unit = _unit()
    good = pd.DataFrame({"layer": [0, 1], "mean": [1.0, 0.5]})
    cache.put(unit, good)
    path = cache.path(unit)
    if plant == "link":
        path.unlink()
        path.symlink_to(victim)
    elif plant == "garbage":
        path.write_bytes(os.urandom(512))
    elif plant == "folder":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(path.read_bytes()[:40])
    assert cache.get(unit) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cache entry" in err[0] and "recomputing" in err[0]
    assert victim.read_text() == "precious\n"
    assert not path.exists() and not path.is_symlink()  # set aside under another name
    assert any(p.name.startswith(path.name + ".rejected-") for p in path.parent.iterdir())
    cache.put(unit, good)  # the recomputed entry is a regular file again
    assert not path.is_symlink()
    pd.testing.assert_frame_equal(cache.get(unit), good)


def test_summary_refuses_a_claims_file_that_is_a_link(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps([]))
    run = tmp_path / "run"
    run.mkdir()
    (run / "claims.json").symlink_to(target)
    code, out, err = invoke(["reproduce", "summary", str(run)], tmp_path)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "symbolic link" in err


def test_mask_file_errors_quote_a_short_excerpt_only(tmp_path):
    leaky = tmp_path / "environ"
    leaky.write_bytes((("SHELL=/bin/bash\0" + SECRET + "\0") * 40).encode())
    code, out, err = invoke(["mask", "describe", f"file:{leaky}", "--n-tokens", "8"], tmp_path)
    assert code == 2
    line = err.strip()
    assert len(line.splitlines()) == 1 and "hunter2" not in line
    assert "more characters" in line and len(line) < 400


def test_excerpt_escapes_and_counts():
    assert excerpt("a\0b") == "'a\\x00' (+1 more characters)"
    assert excerpt("x" * 50, limit=10) == "'xxxxxxxxxx' (+40 more characters)"


def test_the_cli_boundary_caps_any_error_line():
    err = CliError("word " * 1000)
    assert len(err.format_message()) <= MAX_LINE + 40
    assert err.format_message().endswith("more characters)")


def test_a_model_folder_asking_for_custom_code_is_refused_before_loading(tmp_path, capfd):
    from rankcollapse.models.loading import load_model

    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "auto_map": {"AutoModel": "modeling_evil.EvilModel"}}))
    (folder / "modeling_evil.py").write_text("raise SystemExit('custom code ran')\n")
    with pytest.raises(ModelError, match="auto_map"):
        load_model(str(folder))
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""  # nothing from transformers first


def _one_line_refusal(code: int, out: str, err: str) -> str:
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error: "), err
    return lines[0]


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("content,why", [
    (DEEP, "nested too deeply"),
    ('{"mask": "causal", "W_Q": [[1%s]], "W_K": [[1]], "W_V": [[1]]}' % ("0" * 400), "malformed"),
    ("{\"mask\": \"caf\xe9\"}", "not valid UTF-8"),
    ("{", "not valid JSON"),
])
def test_theory_system_files_that_are_not_systems_are_one_line(tmp_path, content, why):
    path = tmp_path / "system.json"
    path.write_bytes(content.encode("latin-1"))
    line = _one_line_refusal(*invoke(["theory", "find", "--system", str(path)], tmp_path))
    assert why in line


def test_a_fifo_as_system_or_text_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    line = _one_line_refusal(*invoke(["theory", "find", "--system", str(fifo)], tmp_path))
    assert "not a regular file" in line
    from rankcollapse.data import read_text_file
    from rankcollapse.errors import DataError

    with pytest.raises(DataError, match="not a regular file"):
        read_text_file(fifo)


def test_a_jsonl_line_nested_too_deep_is_a_data_error(tmp_path):
    from rankcollapse.data import read_text_file
    from rankcollapse.errors import DataError

    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "fine"}\n' + DEEP + "\n")
    with pytest.raises(DataError, match=":2:"):
        read_text_file(path)


@pytest.mark.parametrize("claims,complete,why", [
    ({}, True, "not a claims file"),
    ([{}], True, "not a claims file"),
    ([], True, "not a claims file"),
    ("[" * 50_000 + "]" * 50_000, True, "nested too deeply"),
    ([{"id": "C01", "effect": "e", "verdict": "reproduced"}], False, "did not finish"),
])
def test_summary_refuses_what_is_not_a_finished_run(tmp_path, claims, complete, why):
    run = tmp_path / "run"
    run.mkdir()
    (run / "claims.json").write_text(claims if isinstance(claims, str) else json.dumps(claims))
    if complete:
        (run / "COMPLETE").write_text("config_hash x\n")
    line = _one_line_refusal(*invoke(["reproduce", "summary", str(run)], tmp_path))
    assert why in line


@pytest.mark.parametrize("command", ["summary", "audit"])
def test_summary_and_audit_refuse_claims_of_the_wrong_shape(tmp_path, command):
    """A claim with id, effect and verdict whose other fields are not a run's (a number for
    the controls, a string for the checks): one line naming the file, not an internal
    error."""
    claim = {"controls": 7, "checks": "x"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "claims.json").write_text(json.dumps([{"id": "C01", "effect": "e", "verdict": "reproduced", **claim}]))
    (run / "config.json").write_text(json.dumps({"configs": [], "scale": "quick"}))
    (run / "COMPLETE").write_text("config_hash x\n")
    line = _one_line_refusal(*invoke(["reproduce", command, str(run)], tmp_path))
    assert f"{str(run / 'claims.json')!r} is not a claims file a run writes" in line, line


@pytest.mark.parametrize("argv", [["reproduce", "--out", ""], ["simulate", "--depth", "2", "--out", " "],
                                  ["mask", "show", "causal", "--n-tokens", "4", "--out="], ["metrics", ""]])
def test_an_empty_path_is_refused_not_taken_as_the_working_directory(tmp_path, argv):
    before = sorted(p.name for p in tmp_path.iterdir())
    line = _one_line_refusal(*invoke(argv, tmp_path))
    assert "is empty" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == before
