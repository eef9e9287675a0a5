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


def _commands(group, path=()):
    """(argv path, click command) of every leaf command under ``group``."""
    import typer.main

    from rankcollapse.cli import app

    group = group or typer.main.get_command(app)
    for name, cmd in getattr(group, "commands", {}).items():
        if getattr(cmd, "commands", None):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_a_mistyped_option_suggests_the_flag(tmp_path):
    """``probe --n-sample`` suggests ``--n-samples``."""
    import re

    from tests.cli._harness import invoke

    code, _, err = invoke(["probe", "--n-sample", "3"], tmp_path)
    m = re.search(r"\(Possible options: ([^)]*)\)", err)
    assert code == 2 and m and set(m.group(1).split(", ")) == {"--n-samples"}, err
