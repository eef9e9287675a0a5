"""Output folders are untrusted input (:mod:`rankcollapse._outdir`): a planted manifest,
a planted link at any depth and a user's file of an output's name are refused before
anything is touched, and the files they point at stay byte-identical."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankcollapse._outdir import (LOCK_NAME, MANIFEST, MARKER, OUTPUT_NAMES, OutputFolder, check_out, manifest,
                                  produced, publish, staging_folder, writing)
from rankcollapse.errors import ConfigError, UnsafePathError


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a link's target, ``"<dir>"``."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = f"-> {os.readlink(p)}" if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
    return out


def run_once(out: Path, files: dict[str, bytes], **kw) -> None:
    """One run that writes ``files`` (relative name -> bytes) into ``out``."""
    with writing(out, "test\n", **kw) as stage:
        for rel, data in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_bytes(data)


@pytest.fixture()
def outside(tmp_path):
    """A folder outside the run with the user's files: what an attack aims at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious\n")
    (folder / "fig.png").write_bytes(b"user figure")
    (folder / "result.json").write_text('{"mine": true}\n')
    return folder


@pytest.fixture()
def run(tmp_path):
    """A finished run folder (result.json, plots/fig.png) with a user's note beside it."""
    out = tmp_path / "out"
    run_once(out, {"result.json": b"{}", "plots/fig.png": b"png"})
    (out / "notes.txt").write_text("the user's note\n")
    return out


def plant_manifest(out: Path, *entries: str) -> None:
    (out / MANIFEST).write_text(json.dumps(sorted(json.loads((out / MANIFEST).read_text())) + list(entries)))


@pytest.mark.parametrize("entry", ["{victim}", "sub/keep.txt", "notes.txt", "../outside/keep.txt", "./result.json",
                                   "plots//fig.png", "", 7])
def test_a_manifest_naming_what_no_run_writes_is_refused_and_nothing_is_touched(run, outside, entry):
    if entry == "sub/keep.txt":
        (run / "sub").symlink_to("../outside")
    entry = str(outside / "keep.txt") if entry == "{victim}" else entry
    plant_manifest(run, entry)
    before, victims = tree(run), tree(outside)
    with pytest.raises(UnsafePathError, match="not a file this toolkit writes") as err:
        run_once(run, {"result.json": b"new"})
    assert "\n" not in str(err.value) and str(run / MANIFEST) in str(err.value)
    assert tree(outside) == victims and tree(run) == before


def test_a_manifest_entry_through_a_planted_folder_link_is_refused(run, outside):
    (run / "plots" / "fig.png").unlink()
    (run / "plots").rmdir()
    (run / "plots").symlink_to(outside)  # the manifest lists plots/fig.png, now outside/fig.png
    before, victims = tree(run), tree(outside)
    with pytest.raises(UnsafePathError, match="plots' is a symbolic link"):
        run_once(run, {"result.json": b"new"})
    assert tree(outside) == victims and tree(run) == before


def test_a_listed_file_that_is_a_link_is_refused(run, outside):
    (run / "plots" / "fig.png").unlink()
    (run / "plots" / "fig.png").symlink_to(outside / "fig.png")
    before, victims = tree(run), tree(outside)
    with pytest.raises(UnsafePathError, match="fig.png' is a symbolic link"):
        run_once(run, {"result.json": b"new"})
    assert tree(outside) == victims and tree(run) == before


@pytest.mark.parametrize("content", [b"not json", b'{"a": 1}', b'"result.json"'])
def test_a_manifest_that_is_not_a_list_of_names_is_refused(run, content):
    (run / MANIFEST).write_bytes(content)
    before = tree(run)
    with pytest.raises(UnsafePathError, match="not a list of file names"):
        check_out(run)
    assert tree(run) == before


def test_a_manifest_that_is_a_link_is_refused(run, outside):
    (outside / "m.json").write_text(json.dumps([str(outside / "keep.txt")]))
    (run / MANIFEST).unlink()
    (run / MANIFEST).symlink_to(outside / "m.json")
    victims = tree(outside)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        run_once(run, {"result.json": b"new"})
    assert tree(outside) == victims


def test_publishing_never_follows_a_folder_link_where_it_would_write(run, outside):
    """plots/ replaced by a link after the run: the rerun's plots/fig.png would land outside."""
    (run / "plots" / "fig.png").unlink()
    (run / "plots").rmdir()
    (run / "plots").symlink_to(outside)
    plant_manifest_without = [p for p in json.loads((run / MANIFEST).read_text()) if not p.startswith("plots/")]
    (run / MANIFEST).write_text(json.dumps(plant_manifest_without))
    before, victims = tree(run), tree(outside)
    with pytest.raises(UnsafePathError, match="plots' is a symbolic link"):
        run_once(run, {"result.json": b"new", "plots/fig.png": b"new png"})
    assert tree(outside) == victims and tree(run) == before


def test_publish_itself_refuses_a_link_planted_after_the_checks(run, outside):
    """The last check is at publishing: a link that appears while the run computes."""
    with OutputFolder(run):
        stage = staging_folder(run)
        (stage / "plots").mkdir()
        (stage / "plots" / "fig.png").write_bytes(b"new png")
        (run / "plots" / "fig.png").unlink()
        (run / "plots").rmdir()
        (run / "plots").symlink_to(outside)
        victims = tree(outside)
        with pytest.raises(UnsafePathError, match="plots' is a symbolic link"):
            publish(run, stage, "test\n")
    assert tree(outside) == victims and not stage.exists()
    assert (run / MARKER).is_file()  # the previous run is still marked whole


def test_a_deeper_link_is_refused_too(tmp_path, outside):
    out = tmp_path / "out"
    run_once(out, {"result.json": b"{}"})
    (out / "plots").mkdir()
    (out / "plots" / "fig.png").symlink_to(outside / "fig.png")  # not listed: a user's link where a run writes
    victims = tree(outside)
    with pytest.raises(UnsafePathError, match="fig.png' is a symbolic link"):
        run_once(out, {"result.json": b"{}", "plots/fig.png": b"new"})
    assert tree(outside) == victims


@pytest.mark.parametrize("plant", ["link", "fifo"])
def test_a_planted_marker_is_refused_before_the_folder_is_locked(run, outside, plant):
    (run / MARKER).unlink()
    if plant == "link":
        (run / MARKER).symlink_to(outside / "keep.txt")
    else:
        os.mkfifo(run / MARKER)
    victims = tree(outside)
    with pytest.raises(UnsafePathError, match="COMPLETE"):
        run_once(run, {"result.json": b"new"})
    assert tree(outside) == victims


def test_allow_nonempty_keeps_every_file_and_refuses_one_of_an_outputs_name(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.html").write_text("the user's report\n")
    (out / "thesis.tex").write_text("user data\n")
    before = tree(out)
    with pytest.raises(ConfigError, match="non-empty folder that no run wrote"):
        check_out(out, ["report.html"])
    with pytest.raises(ConfigError, match="would replace: report.html;"):
        check_out(out, ["report.html"], allow_nonempty=True)
    with pytest.raises(ConfigError, match="would replace: report.html;"):  # a name not known in advance
        run_once(out, {"report.html": b"<html>"}, allow_nonempty=True)
    assert tree(out) == {**before, LOCK_NAME: (out / LOCK_NAME).read_bytes()}
    run_once(out, {"phase.parquet": b"table"}, allow_nonempty=True)
    assert manifest(out) == {"phase.parquet"}  # only what the run wrote is listed as its own
    assert (out / "report.html").read_text() == "the user's report\n" and (out / "thesis.tex").read_text() == "user data\n"


def test_a_users_file_of_an_outputs_name_in_an_own_folder_is_refused(run):
    (run / "report.md").write_text("my draft\n")
    with pytest.raises(ConfigError, match=r"holds files no run wrote that this run would replace: report.md;"):
        check_out(run, ["result.json", "report.md"], flags=True)
    assert (run / "report.md").read_text() == "my draft\n"


def test_a_rerun_replaces_and_removes_only_its_own_files(run):
    """The folder's own run is rerun: listed files replaced or removed; the user's note,
    a user's figure beside the plots and the cache stay."""
    (run / "plots" / "mine.png").write_bytes(b"user figure")
    (run / "cache").mkdir()
    (run / "cache" / "unit.parquet").write_bytes(b"cached")
    run_once(run, {"result.json": b"second"})
    assert (run / "result.json").read_bytes() == b"second"
    assert not (run / "plots" / "fig.png").exists() and (run / "plots" / "mine.png").read_bytes() == b"user figure"
    assert (run / "notes.txt").read_text() == "the user's note\n" and (run / "cache" / "unit.parquet").exists()
    assert manifest(run) == {"result.json"} and (run / MARKER).read_text() == "test\n"
    run_once(run, {"result.json": b"third", "plots/fig.png": b"png"})  # plots/ exists: a user's file is in it
    assert manifest(run) == {"result.json", "plots/fig.png"}


def test_a_run_of_a_version_without_a_manifest_owns_only_its_top_level_outputs(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / MARKER).write_text("config_hash x\n")
    (out / "table.csv").write_text("old")
    (out / "notes.txt").write_text("mine")
    assert manifest(out) == set(OUTPUT_NAMES)
    run_once(out, {"result.json": b"{}"})
    assert not (out / "table.csv").exists() and (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("name,ok", [
    ("report.md", True), ("plots/fig3_mu.png", True), ("heatmap_003.png", True), ("windows_12.npz", True),
    ("notes.txt", False), ("/etc/passwd", False), ("plots/../report.md", False), ("plots/a/b.png", False),
    ("sub/keep.txt", False), ("plots\\x.png", False), ("report.md/", False), (None, False)])
def test_produced_names(name, ok):
    assert produced(name) is ok


def test_a_refused_folder_is_left_as_it_was(tmp_path, outside):
    """Nothing is created, not even the lock, in a folder that is refused."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "plots").symlink_to(outside)
    (out / LOCK_NAME).write_text("")  # looks like ours
    before = tree(out)
    with pytest.raises(UnsafePathError):
        with OutputFolder(out):
            pass
    assert tree(out) == before


def test_a_planted_staging_link_is_removed_not_entered(run, outside):
    (run / ".rankcollapse-staging").symlink_to(outside)
    victims = tree(outside)
    run_once(run, {"result.json": b"second"})
    assert tree(outside) == victims and (run / "result.json").read_bytes() == b"second"
    assert not (run / ".rankcollapse-staging").exists()


def test_a_cache_folder_that_is_a_link_is_refused(run, outside):
    (run / "cache").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="cache' is a symbolic link"):
        check_out(run)
