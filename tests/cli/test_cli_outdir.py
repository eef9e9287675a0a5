"""Every command that writes ``--out`` refuses a planted manifest, a planted link and a
user's file of an output's name with one line and exit 2, before any work, and the
files they aim at stay byte-identical (rankcollapse._outdir)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rankcollapse._outdir import LOCK_NAME, MANIFEST, MARKER
from rankcollapse.errors import excerpt

from ._harness import invoke

SIMULATE = ["simulate", "--n-tokens", "4", "--depth", "2", "--d-model", "2", "--n-samples", "1", "--format", "json"]
REPRODUCE = ["reproduce", "influence", "--scale", "smoke", "--no-nearby", "--no-progress"]
PHASE = ["phase", "--depth", "2", "--n-tokens", "4", "--d-model", "2", "--n-samples", "1", "--axis", "qk_scale=1"]
PROBE = ["probe", "--model", "minilm", "--n-samples", "1", "--n-tokens", "8"]


def tree(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a link's target, ``"<dir>"``."""
    return {p.relative_to(root).as_posix(): f"-> {os.readlink(p)}" if p.is_symlink() else "<dir>" if p.is_dir()
            else p.read_bytes() for p in sorted(root.rglob("*"))}


def refused(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error: "), err
    return lines[0]


@pytest.fixture()
def outside(tmp_path):
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious\n")
    (folder / "influence_masks.png").write_bytes(b"the user's figure")
    return folder


def test_simulate_reruns_into_its_own_folder_and_keeps_the_users_files(tmp_path):
    code, _, err = invoke([*SIMULATE, "--out", "run"], tmp_path)
    assert code == 0, err
    run = tmp_path / "run"
    assert json.loads((run / MANIFEST).read_text()) == ["mu_loglog.png", "result.json"] and (run / MARKER).is_file()
    (run / "notes.txt").write_text("mine\n")
    first = (run / "result.json").read_bytes()
    code, _, err = invoke([*SIMULATE, "--seed", "1", "--out", "run"], tmp_path)
    assert code == 0, err
    assert (run / "result.json").read_bytes() != first and (run / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("entry", ["victim", "link", "note"])
def test_a_planted_manifest_entry_deletes_nothing(tmp_path, outside, entry):
    """An absolute entry, one through a planted link (sub -> ../outside) and the user's own
    note: the rerun is refused naming the manifest, and every file stays."""
    assert invoke([*SIMULATE, "--out", "run"], tmp_path)[0] == 0
    run = tmp_path / "run"
    (run / "notes.txt").write_text("the user's note\n")
    if entry == "link":
        (run / "sub").symlink_to("../outside")
    planted = {"victim": str(outside / "keep.txt"), "link": "sub/keep.txt", "note": "notes.txt"}[entry]
    (run / MANIFEST).write_text(json.dumps(["mu_loglog.png", "result.json", planted]))
    before, victims = tree(run), tree(outside)
    line = refused(*invoke([*SIMULATE, "--out", "run"], tmp_path))
    assert "manifest" in line and excerpt(planted) in line
    assert tree(outside) == victims and tree(run) == before


def _plant_own_run(out: Path, outside: Path) -> None:
    """A finished reproduce folder whose plots/ is a link to the user's folder."""
    out.mkdir()
    (out / LOCK_NAME).write_text("")
    (out / MARKER).write_text("config_hash x\n")
    (out / MANIFEST).write_text(json.dumps(["plots/influence_masks.png", "report.md"]))
    (out / "report.md").write_text("# old run\n")
    (out / "plots").symlink_to(outside)


def test_reproduce_never_publishes_through_a_folder_link(tmp_path, outside):
    _plant_own_run(tmp_path / "out", outside)
    before, victims = tree(tmp_path / "out"), tree(outside)
    line = refused(*invoke([*REPRODUCE, "--out", "out", "--cache-dir", "cache"], tmp_path))
    assert "plots' is a symbolic link" in line
    assert tree(outside) == victims and tree(tmp_path / "out") == before
    assert not (tmp_path / "cache").exists()  # refused before any unit ran


def test_reproduce_refuses_a_figure_no_run_wrote_before_any_unit_runs(tmp_path):
    """A finished run folder of a version without a manifest (a committed result copied
    elsewhere) vouches for its top-level outputs only: its figure ``plots/*.png`` is
    refused up front, not found at publish time after the work."""
    out = tmp_path / "old"
    (out / "plots").mkdir(parents=True)
    (out / MARKER).write_text("config_hash x\n")
    (out / "report.md").write_text("# old run\n")
    (out / "plots" / "influence_masks.png").write_bytes(b"old figure")
    before = tree(out)
    line = refused(*invoke([*REPRODUCE, "--out", "old", "--cache-dir", "cache"], tmp_path))
    assert line.endswith("--out 'old' holds files no run wrote that this run would replace: "
                         "plots/influence_masks.png; move them or choose another folder"), line
    assert tree(out) == before and not (tmp_path / "cache").exists()  # refused before any unit ran


@pytest.mark.parametrize("argv,name", [
    (PHASE, "report.html"),
    ([*REPRODUCE, "--cache-dir", "cache"], "report.md"),
    (SIMULATE, "result.json"),
    (PROBE, "probe.csv"),
])
def test_a_users_file_of_an_outputs_name_is_never_replaced(tmp_path, argv, name):
    """Refused in a folder no run wrote, and with --allow-nonempty too (naming the file):
    before any work, the folder as it was."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / name).write_text("the user's own file\n")
    before = tree(mine)
    line = refused(*invoke([*argv, "--out", "mine"], tmp_path))
    assert "--allow-nonempty" in line
    line = refused(*invoke([*argv, "--out", "mine", "--allow-nonempty"], tmp_path))
    assert f"would replace: {name};" in line
    assert tree(mine) == before and not (tmp_path / "cache").exists()


def test_commands_that_add_one_file_gather_in_one_folder(tmp_path):
    """mask show, mask compare and theory system into one folder: each adds its file and
    keeps the others; a user's file of one of those names is refused."""
    for argv in (["mask", "show", "causal", "--n-tokens", "4"], ["mask", "compare", "causal", "complete", "--n-tokens", "4"],
                 ["theory", "system"]):
        code, _, err = invoke([*argv, "--out", "figs"], tmp_path)
        assert code == 0, err
    figs = tmp_path / "figs"
    assert json.loads((figs / MANIFEST).read_text()) == ["compare.csv", "mask.png", "system.json"]
    (figs / "mask.svg").write_text("<svg>the user's</svg>")
    before = tree(figs)
    line = refused(*invoke(["mask", "show", "causal", "--n-tokens", "4", "--image-format", "svg", "--out", "figs"],
                           tmp_path))
    assert "would replace: mask.svg;" in line and tree(figs) == before
