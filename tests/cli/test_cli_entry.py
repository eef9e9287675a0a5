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


def test_a_mistyped_option_never_suggests_a_hidden_one(tmp_path):
    """``probe --n-sample`` suggests ``--n-samples`` and not the hidden ``--d-qk-scale``; on
    every command, a hidden option mistyped in its last letter is never suggested."""
    import re

    from tests.cli._harness import invoke

    def suggested(err):
        m = re.search(r"\(Possible options: ([^)]*)\)", err)
        return set(m.group(1).split(", ")) if m else set()

    code, _, err = invoke(["probe", "--n-sample", "3"], tmp_path)
    assert code == 2 and suggested(err) == {"--n-samples"}, err
    checked = 0
    for path, cmd in _commands(None):
        hidden = {o for p in cmd.params if getattr(p, "hidden", False) for o in p.opts}
        for opt in sorted(o for o in hidden if o.startswith("--")):
            code, _, err = invoke([*path, opt[:-1] + "#"], tmp_path)
            assert code == 2 and "No such option" in err, (path, opt, err)
            assert not suggested(err) & hidden, (path, opt, err)
            checked += 1
    assert checked >= 1
