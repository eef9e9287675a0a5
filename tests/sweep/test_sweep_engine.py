"""Sweep engine mechanics with the synthetic executor: cache key and cache, table order
independent of completion order, --recompute, output folder ownership and cleanup,
progress lines, per-unit timings, executor option errors."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from rankcollapse import _io
from rankcollapse.sweep import units as sweep_units
from rankcollapse.errors import ConfigError, OutputBusyError
from rankcollapse.experiments import ExecutionConfig, StorageConfig, runner
from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep.units import Unit
from rankcollapse.sweep.executors import Done, validate_executor
from rankcollapse._outdir import LOCK_NAME, MANIFEST, OutputFolder, owner
from rankcollapse.sweep.progress import UnitProgress

QUIET = ExecutionConfig(progress=False)
IN_MEMORY = StorageConfig(write=False)  # no output folder



def test_cache_key_is_numerics_version_and_library_versions_not_source(monkeypatch):
    key = sweep_units.numerics_key()
    assert key["numerics"] == sweep_units.NUMERICS_VERSION and "+" not in key["torch"]
    assert set(key) == {"numerics", *sweep_units.NUMERIC_LIBRARIES}
    assert sweep_units.code_fingerprint() == _io.config_hash(key)
    unit = Unit("simulate", {"mask": "complete", "seed": 0})
    before = unit.hash
    sweep_units.code_fingerprint.cache_clear()
    monkeypatch.setattr(sweep_units, "NUMERICS_VERSION", sweep_units.NUMERICS_VERSION + 1)
    try:
        assert unit.hash != before  # a declared numerics change invalidates the cache
    finally:
        sweep_units.code_fingerprint.cache_clear()
    monkeypatch.undo()
    assert unit.hash == before


def test_unit_cache_roundtrip_recompute_once_and_orphans(tmp_path):
    u = Unit("theory", {"check": "x"})
    frame = pd.DataFrame({"layer": [0, 1], "mean": [1.0, 0.25]})
    cache = UnitCache(tmp_path)
    assert cache.get(u) is None
    path = cache.put(u, frame)
    assert path.name == f"theory-{u.hash}.parquet"
    pd.testing.assert_frame_equal(cache.get(u), frame)
    forced = UnitCache(tmp_path, recompute=True)
    assert forced.get(u) is None  # recompute ignores the stored entry ...
    forced.put(u, frame.assign(mean=[2.0, 3.0]))
    assert forced.get(u)["mean"].tolist() == [2.0, 3.0]  # ... once: its own result is reused
    old = tmp_path / f".theory-x.parquet.abc{_io.TMP_SUFFIX}"
    old.write_text("partial")
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    young = tmp_path / f".theory-y.parquet.def{_io.TMP_SUFFIX}"
    young.write_text("being written")
    assert cache.remove_orphans() == 1 and not old.exists() and young.exists()


def test_unit_cache_many_writers_leave_one_whole_file(tmp_path):
    u = Unit("theory", {"check": "y"})
    frame = pd.DataFrame({"mean": [float(k) for k in range(2000)]})
    threads = [threading.Thread(target=UnitCache(tmp_path).put, args=(u, frame)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.name for p in tmp_path.iterdir()] == [f"theory-{u.hash}.parquet"]
    pd.testing.assert_frame_equal(UnitCache(tmp_path).get(u), frame)


class ReversedExecutor:
    """Finishes units in reverse order, like a pool where the last unit is quickest."""

    name, workers = "reversed", 2

    def map(self, units, ctx, table):
        for i in reversed(range(len(units))):
            yield Done(i, table[units[i].kind](units[i], ctx), 0.5, 0.25, "w")

    def close(self):
        pass


def test_table_in_unit_order_whatever_the_completion_order(fake, tmp_path):
    cfgs, units, data = runner.plan("theory", "smoke", 0)
    ctx = runner.RunContext(data, "cpu")
    serial, _ = runner.compute_units(units, ctx, tmp_path / "a", progress=False)
    rev, timings = runner.compute_units(units, ctx, tmp_path / "b", progress=False, executor=ReversedExecutor())
    pd.testing.assert_frame_equal(rev, serial)
    assert {t["worker"] for t in timings} == {"w"} and {t["cpu_seconds"] for t in timings} == {0.25}
    with runner.using_executor(ReversedExecutor()):  # the run's executor is the default
        again, timings = runner.compute_units(units, ctx, tmp_path / "c", progress=False)
    pd.testing.assert_frame_equal(again, serial)
    assert {t["worker"] for t in timings} == {"w"}


def test_recompute_reruns_every_unit_and_timings_are_recorded(fake, tmp_path):
    res = runner.run_experiment("theory", "smoke", tmp_path / "run", nearby=False, execution=QUIET, storage=IN_MEMORY)
    n = fake.calls
    runner.run_experiment("theory", "smoke", tmp_path / "run", nearby=False, execution=QUIET, storage=IN_MEMORY)
    assert fake.calls == n
    again = runner.run_experiment("theory", "smoke", tmp_path / "run", nearby=False, execution=QUIET, storage=StorageConfig(recompute=True))
    assert fake.calls == 2 * n
    pd.testing.assert_frame_equal(again.table, res.table)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert len(cfg["timings"]) == n and all(not t["cached"] for t in cfg["timings"])
    assert all(t["seconds"] >= 0 and t["cpu_seconds"] >= 0 and t["worker"] for t in cfg["timings"])
    assert cfg["execution"]["executor"] == "serial" and cfg["execution"]["numerics"] == sweep_units.numerics_key()


def test_second_owner_is_refused_naming_the_first_or_waits(tmp_path):
    with OutputFolder(tmp_path / "out"):
        info = owner(tmp_path / "out")
        assert info["pid"] == os.getpid() and info["host"]
        with pytest.raises(OutputBusyError, match=f"in use by run pid {os.getpid()} on host"):
            OutputFolder(tmp_path / "out").__enter__()
    got = []
    first = OutputFolder(tmp_path / "out").__enter__()
    waiter = threading.Thread(target=lambda: got.append(OutputFolder(tmp_path / "out", wait=True, poll_s=0.05).__enter__()))
    waiter.start()
    time.sleep(0.3)
    assert not got  # still waiting
    first.__exit__(None, None, None)
    waiter.join(5)
    assert len(got) == 1
    got[0].__exit__(None, None, None)


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    code = ("import sys,time; from rankcollapse._outdir import OutputFolder; "
            "OutputFolder(sys.argv[1]).__enter__(); print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(OutputBusyError, match=f"pid {proc.pid}"):
            OutputFolder(tmp_path / "out").__enter__()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert owner(tmp_path / "out")["pid"] == proc.pid  # the dead run's record is still there
    with OutputFolder(tmp_path / "out"):
        assert owner(tmp_path / "out")["pid"] == os.getpid()


def test_cli_second_run_into_same_out_exits_2_naming_the_first(fake, tmp_path, monkeypatch, capsys):
    from rankcollapse.cli import main

    monkeypatch.setattr(sys, "argv", ["rankcollapse", "reproduce", "theory", "--scale", "smoke", "--out",
                                      str(tmp_path / "out"), "--no-progress"])
    with OutputFolder(tmp_path / "out"), pytest.raises(SystemExit) as exit_:
        main()  # another open of the lock file: refused like another process
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and fake.calls == 0
    assert err.strip().splitlines() == [
        f"rankcollapse: error: {tmp_path / 'out'} is in use by {_describe(tmp_path / 'out')}; "
        "wait for that run to finish or choose another output folder"]


def _describe(out):
    info = owner(out)
    return f"run pid {info['pid']} on host {info['host']} since {info['started']}"


def test_rerun_clears_only_outputs_it_wrote_and_marks_complete_last(fake, tmp_path):
    out = tmp_path / "run"
    runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    first = set(json.loads((out / MANIFEST).read_text()))
    assert "table.parquet" in first and any(p.startswith("plots/") for p in first)
    # a plot the first run wrote that the second will not: listed, so removed
    stale = sorted(p for p in first if p.startswith("plots/"))[0]
    (out / MANIFEST).write_text(json.dumps(sorted(first | {"plots/fig2_stale.png"})))
    (out / "plots" / "fig2_stale.png").write_bytes(b"old plot")
    (out / f".table.csv.x1{_io.TMP_SUFFIX}").write_text("orphan")
    (out / "plots" / f".p.png.x2{_io.TMP_SUFFIX}").write_text("orphan")
    # the user's own files, wherever they are, are never touched
    (out / "notes.txt").write_text("the user's own file")
    (out / "plots" / "my_figure.png").write_bytes(b"mine")
    (out / ".draft.tmp").write_text("mine too")
    runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert "plots/fig2_stale.png" not in names and stale in names
    assert not [n for n in names if n.endswith(_io.TMP_SUFFIX)] and not (out / ".rankcollapse-staging").exists()
    assert {"notes.txt", "plots/my_figure.png", ".draft.tmp", "COMPLETE", "table.parquet", "report.html",
            LOCK_NAME, MANIFEST} <= names
    assert (out / "plots" / "my_figure.png").read_bytes() == b"mine"
    complete = (out / "COMPLETE").stat().st_mtime_ns
    own = set(json.loads((out / MANIFEST).read_text()))
    assert all((out / n).stat().st_mtime_ns <= complete for n in own)


def test_a_failed_rerun_leaves_the_previous_run_whole(fake, tmp_path, monkeypatch):
    import errno

    from rankcollapse.experiments import report

    out = tmp_path / "run"
    runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_NAME}

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "render_markdown", full_disk)
    with pytest.raises(OSError):
        runner.run_experiment("theory", "smoke", out, seed=1, nearby=False, execution=QUIET)
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    assert after == before  # same files, same bytes: the first run, still COMPLETE


def test_a_foreign_nonempty_out_is_refused_unless_allowed(fake, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("user data")
    with pytest.raises(ConfigError, match="pass allow_nonempty=True to write beside"):
        runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]  # nothing created
    runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET, storage=StorageConfig(allow_nonempty=True))
    assert (out / "COMPLETE").is_file() and (out / "thesis.tex").read_text() == "user data"
    runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)  # now ours: no flag needed
    draft = tmp_path / "drafts"
    draft.mkdir()
    (draft / "report.md").write_text("the user's draft\n")  # a file of an output's name: never replaced
    with pytest.raises(ConfigError, match="would replace: report.md;"):
        runner.run_experiment("theory", "smoke", draft, nearby=False, execution=QUIET, storage=StorageConfig(allow_nonempty=True))
    assert sorted(p.name for p in draft.iterdir()) == ["report.md"]
    assert (draft / "report.md").read_text() == "the user's draft\n"


def test_a_rerun_never_publishes_through_a_planted_plots_link(fake, tmp_path):
    from rankcollapse.errors import UnsafePathError

    out = tmp_path / "run"
    runner.run_experiment("theory", "smoke", out, nearby=False, execution=QUIET)
    outside = tmp_path / "outside"
    (out / "plots").rename(outside)  # the same figure names, now the user's folder
    (out / "plots").symlink_to(outside)
    victims = {p.name: p.read_bytes() for p in outside.iterdir()}
    calls = fake.calls
    with pytest.raises(UnsafePathError, match="plots' is a symbolic link"):
        runner.run_experiment("theory", "smoke", out, seed=1, nearby=False, execution=QUIET)
    assert {p.name: p.read_bytes() for p in outside.iterdir()} == victims and fake.calls == calls


def test_cache_orphan_cleaning_keeps_a_users_tmp_files(tmp_path):
    cache = UnitCache(tmp_path)
    notes = tmp_path / ".notes.tmp"
    notes.write_text("mine")
    old = tmp_path / f".theory-x.parquet.abc{_io.TMP_SUFFIX}"
    old.write_text("partial")
    for p in (notes, old):
        os.utime(p, (time.time() - 2 * 86400,) * 2)
    assert cache.remove_orphans() == 1 and notes.exists() and not old.exists()


def test_progress_bar_on_a_terminal_shows_counts(capsys):
    with UnitProgress("fig3", 3, tty=True) as bar:
        bar.start(1, 2, 2, "processes")
        bar.running("pretrained_sa[mask=causal]")
        bar.finished("pretrained_sa[mask=causal]", 1.0)
        bar.finished("pretrained_sa[mask=complete]", 1.0)
    err = capsys.readouterr().err
    assert "3/3" in err and "ETA" in err


@pytest.mark.parametrize("kw, message", [
    ({"name": "threads"}, "^executor 'threads' is unknown"),
    ({"name": "processes", "workers": 0}, "workers must be >= 1"),
    ({"name": "processes", "address": "auto"}, "^address applies to the ray executor only"),
])
def test_executor_options_are_checked(kw, message):
    with pytest.raises(ConfigError, match=message):
        validate_executor(**kw)


def test_a_failed_run_leaves_no_lock_in_a_folder_it_made(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with OutputFolder(out):
            (out / "cache").mkdir()  # an empty cache folder, as a run that failed on its first unit
            raise RuntimeError("failed")
    assert not out.exists()
    # a folder an earlier run owns keeps its lock (and its files)
    with OutputFolder(out):
        pass
    with pytest.raises(RuntimeError):
        with OutputFolder(out):
            raise RuntimeError("failed")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
