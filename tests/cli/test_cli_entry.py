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


def _first_valued_option(cmd):
    from typer.core import TyperOption

    return next(o.opts[0] for o in cmd.params if isinstance(o, TyperOption) and not (o.is_flag or o.count))


@pytest.mark.parametrize("path, cmd", list(_commands(None)), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_an_option_without_its_value_is_named_with_the_commands_help(tmp_path, path, cmd):
    """``simulate --depth``: the option needs a value, see ``rankcollapse simulate --help``."""
    from tests.cli._harness import invoke

    option = _first_valued_option(cmd)
    code, out, err = invoke([*path, option], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"rankcollapse: error: option {option} needs a value (see '"), err
    assert lines[0].endswith(f" {' '.join(path)} --help')"), err


@pytest.mark.parametrize("path, cmd", list(_commands(None)), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_an_option_whose_value_is_another_option_is_named(tmp_path, path, cmd):
    """``simulate --out --help`` (or ``--mask --depth 3``): the option got no value, nothing runs or is written."""
    from tests.cli._harness import invoke

    option = _first_valued_option(cmd)
    code, out, err = invoke([*path, option, "--help"], tmp_path)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"rankcollapse: error: option {option} needs a value; it got the option --help "
                               "instead (see '"), err
    assert list(tmp_path.iterdir()) == []


def test_a_string_option_followed_by_an_option_is_refused(tmp_path):
    from tests.cli._harness import invoke

    code, out, err = invoke(["simulate", "--mask", "--depth", "3"], tmp_path)
    assert code == 2 and out == "", err
    assert err.startswith("rankcollapse: error: option --mask needs a value; it got the option --depth instead"), err


def test_a_reader_closing_stdout_is_no_error():
    """``rankcollapse ... | head``: the closed pipe ends the command quietly (click's status 1), with no
    "operating-system error: Broken pipe" line."""
    proc = subprocess.Popen([*CLI, "mask", "describe", "causal", "--n-tokens", "5", "--format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == ""


def test_a_mistyped_option_suggests_the_flag(tmp_path):
    """``probe --n-sample`` suggests ``--n-samples``."""
    import re

    from tests.cli._harness import invoke

    code, _, err = invoke(["probe", "--n-sample", "3"], tmp_path)
    m = re.search(r"\(Possible options: ([^)]*)\)", err)
    assert code == 2 and m and set(m.group(1).split(", ")) == {"--n-samples"}, err


# main() with run() replaced by a print of the policy main() leaves for torch to read
THREADS_PROBE = ("import os; import rankcollapse.cli as c; "
                 "c.run = lambda argv=None: print(os.environ.get('OMP_WAIT_POLICY')) or 0; c.main()")


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_entry_point_lets_waiting_threads_sleep_unless_the_caller_chose(given, expected):
    import os

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", THREADS_PROBE, "--version"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


@pytest.mark.slow  # a whole run or fresh processes: CI runs it with the slow tests
def test_simulated_numbers_do_not_depend_on_the_thread_settings():
    import json
    import os

    args = ["simulate", "--n-tokens", "32", "--d-model", "16", "--depth", "6", "--n-samples", "2",
            "--mask", "causal", "--seed", "3", "--format", "json"]
    mus = []
    for extra in ({"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"},
                  {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}):
        env = {**os.environ, **extra}
        out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        mus.append([row["mu"] for row in json.loads(out.stdout)["layers"]])
    assert len(mus[0]) == 7
    for other in mus[1:]:  # float32, 6 layers: the thread split changes round-off only
        assert other == pytest.approx(mus[0], rel=1e-5)


def test_an_interrupt_says_rerun_only_where_that_resumes(monkeypatch, capsys):
    """Ctrl-C ends with exit 130 and one line; it says "rerun ... to resume" only for the
    commands whose finished units are cached (reproduce, phase), not for e.g. mask describe."""
    from rankcollapse import cli, masks

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(masks, "analyze", stop)
    assert cli.run(["mask", "describe", "causal", "--n-tokens", "8"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["rankcollapse: interrupted"]
    assert cli.interrupted(["--version", "reproduce", "main"]) == "rankcollapse: interrupted; rerun the same command to resume"
    assert cli.interrupted(["phase"]).endswith("to resume") and cli.interrupted(["simulate"]) == "rankcollapse: interrupted"
