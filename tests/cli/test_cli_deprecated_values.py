"""A deprecated value spelling on the command line (``simulate --variant ln``, ``--variant
skip_ln``, ``--placement theory``, ``--input wiki``'s kind) runs as its current name and
prints the CLI's one deprecation note, never Python's FutureWarning with a file and line."""

import subprocess
import sys

import pytest

from rankcollapse.cli._vocab import NOTE

SMALL = ["--n-tokens", "8", "--depth", "2", "--d-model", "4", "--n-samples", "2", "--format", "json"]


def _simulate(*argv, cwd):
    cmd = [sys.executable, "-c", "from rankcollapse.cli import main; main()", "simulate", *argv, *SMALL]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.parametrize("flag, old, new", [("--variant", "ln", "sphere"), ("--variant", "skip_ln", "post_ln"),
                                            ("--placement", "theory", "none")])
def test_a_deprecated_value_is_one_note_and_the_same_run(tmp_path, flag, old, new):
    done_old, done_new = _simulate(flag, old, cwd=tmp_path), _simulate(flag, new, cwd=tmp_path)
    assert done_old.returncode == done_new.returncode == 0, done_old.stderr + done_new.stderr
    assert done_old.stderr.splitlines() == [NOTE.format(old=f"{flag} {old}", new=f"{flag} {new}")]
    assert done_new.stderr == ""
    assert done_old.stdout == done_new.stdout  # the same block ran and is recorded under its current name
