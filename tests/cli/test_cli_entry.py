"""The console entry point: help, usage errors and user errors."""

import subprocess
import sys

import pytest

CLI = [sys.executable, "-c", "from rankcollapse.cli import main; main()"]


def run(*args):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_subcommand():
    out = run("--help")
    assert out.returncode == 0
    for name in ("mask", "metrics", "simulate", "theory", "probe", "reproduce"):
        assert name in out.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("nosuch",), "No such command 'nosuch'"),
        (("mask", "describe", "causal", "--n-tokens", "x"), "--n-tokens"),
        (("mask", "describe", "causal", "--n-tokens", "4", "--bogus"), "No such option: --bogus"),
        (("mask", "describe", "nosuchmask", "--n-tokens", "4"), "unknown mask 'nosuchmask'"),
    ],
)
def test_errors_are_one_line_with_status_2(args, fragment):
    out = run(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in out.stderr


def test_no_arguments_shows_help():
    out = run()
    assert out.returncode == 2 and "Usage" in out.stderr + out.stdout
