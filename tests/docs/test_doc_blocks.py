"""Every code block of README.md and docs/*.md runs as written.

``python`` blocks of one file run in order in one namespace, in a temporary folder; a
block written as a doctest (``>>>`` prompts, e.g. the README's quickstart) runs as one,
so its printed outputs are checked too.
``bash`` blocks (and indented ``rankcollapse ...`` lines) run through the CLI in
process (typer's runner; ``&&`` and ``> file`` handled), in a temporary folder holding
the input files the docs name (X.npy, pm.npy, my.txt, my_corpus.txt, clean.txt,
prompts.txt). Commands that load
SmolLM2, MiniLM or run an experiment job go to the slow test, some with smaller sizes
(:data:`SMALLER`). The few that cannot run here are listed in :data:`ILLUSTRATIVE`
with the reason; a new command that matches none of the lists runs in the fast test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)

#: Commands that cannot run in a test, by pattern, with the reason. Keep this short.
#: Set-up commands (CI runs its own set-up): illustrative, and not counted against the cap.
SETUP = r"^(make|pip|python3 -m venv)\b"
ILLUSTRATIVE = {
    SETUP: "set-up commands (CI runs its own set-up)",
    r"HF_HUB_OFFLINE=0": "needs a reachable Hugging Face hub",
    r"--scale paper(?!.*--dry-run)": "paper scale takes hours (its --dry-run estimate runs)",
    r"--executor ray": "needs a Ray cluster",
    r"--model (gpt2|t5-small|albert)": "hub checkpoints not installed here",
    r"\[--": "synopsis with optional arguments in brackets",
}
#: Commands that run only in the slow test (real models, a whole experiment job, or the
#: states a probe saved).
SLOW = (r"\bprobe\b|\breproduce\b|--input wiki|--input wikipedia|--pretrained|\bsimulate\b.*--model\b"
        r"|\bmetrics --states\b")  # reads the states a probe saved
#: Smaller sizes for the test runs: (pattern, replacement), applied in order.
SMALLER = [(r"--scale quick", "--scale smoke"), (r"--windows \d+", "--windows 2"),
           (r"(reproduce|probe)(.*)--n-samples \d+", r"\1\2--n-samples 2"),
           (r"--length \d+", "--length 32"), (r"--depth \d+", "--depth 4"),
           (r"(reproduce|probe)(.*)--n-tokens \d+", r"\1\2--n-tokens 32"),
           (r"(simulate|phase)(.*)--n-tokens \d+", r"\1\2--n-tokens 16"),
           (r"theory basin$", "theory basin --n-samples 200 --depth 100"),
           (r"theory bound$", "theory bound --n-tokens 12 --widths 12,5,2 --depth 20 --n-samples 2"),
           (r"(simulate .*--variant post_ln.*)", r"\1 --n-tokens 16 --depth 4")]


def _smaller(command: str) -> str:
    for pattern, repl in SMALLER:
        command = re.sub(pattern, repl, command)
    return command
#: python blocks run by another test (they load real models).
PY_ELSEWHERE = {"models.md": "tests/models/test_models_docs_snippets.py"}


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        for i, (fence, body) in enumerate(_FENCE.findall(doc.read_text(encoding="utf-8"))):
            if fence == lang:
                out.append((doc.name, i, body))
    return out


def _commands() -> list[tuple[str, str]]:
    """``(doc name, command)`` of every shell line in bash blocks and indented blocks."""
    found = []
    for name, _, body in _blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                found.append((name, line))
    for doc in DOCS:
        text = _FENCE.sub("", doc.read_text(encoding="utf-8")).replace("\\\n", " ")  # join continued lines
        for line in re.findall(r"^    ((?:rankcollapse|echo) .*)$", text, re.M):
            found.append((doc.name, line.split(" #")[0].strip()))
    return list(dict.fromkeys(found))  # in order; a line repeated in one doc runs once


def _kind(command: str) -> str:
    if any(re.search(p, command) for p in ILLUSTRATIVE):
        return "illustrative"
    return "slow" if re.search(SLOW, command) else "fast"


_DIRS: dict[str, Path] = {}


@pytest.fixture
def workdir(doc, tmp_path_factory, monkeypatch):
    """One folder per document: its commands run in order there (a file one writes, the
    next may read). Every folder's unit cache (``runs/.rankcollapse-cache``, the default
    of a run under ``runs/``) is one cache of the session: a document's ``reproduce``
    command still runs as written, and reads the units an earlier document computed."""
    if doc not in _DIRS:
        _DIRS[doc] = _inputs(tmp_path_factory.mktemp(doc.replace(".", "_")))
        shared = tmp_path_factory.getbasetemp() / "rankcollapse-cache"
        shared.mkdir(exist_ok=True)
        (_DIRS[doc] / "runs").mkdir()
        (_DIRS[doc] / "runs" / ".rankcollapse-cache").symlink_to(shared, target_is_directory=True)
    monkeypatch.chdir(_DIRS[doc])
    return _DIRS[doc]


def _inputs(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "X.npy", rng.standard_normal((3, 8, 4)))
    pm = np.ones((3, 8), dtype=bool)
    pm[1, 6:] = False
    np.save(tmp_path / "pm.npy", pm)
    text = ("Attention masks shape how tokens mix. " * 40 + "\n\n") * 6
    (tmp_path / "my.txt").write_text(text)
    (tmp_path / "my_corpus.txt").write_text(text)
    (tmp_path / "clean.txt").write_text(text.replace("shape", "steer"))  # patching's clean text, cut alike
    (tmp_path / "prompts.txt").write_text("The capital of France is\nAttention masks shape how tokens mix.\n")
    return tmp_path


def _run(command: str, cwd: Path) -> None:
    from typer.testing import CliRunner

    from rankcollapse.cli import app

    for part in command.split("&&"):
        words = shlex.split(part)
        target = None
        if ">" in words:
            k = words.index(">")
            target, words = words[k + 1], words[:k] + words[k + 2:]  # as the shell: words after the file stay
        if words[0] == "echo":
            (cwd / target).write_text(" ".join(words[1:]) + "\n")
            continue
        assert words[0] == "rankcollapse", command
        res = CliRunner().invoke(app, words[1:], catch_exceptions=True)
        assert res.exit_code == 0, f"{command!r} exited {res.exit_code}: {res.output[-800:]} {res.exception!r}"
        if target is not None:
            (cwd / target).write_text(res.stdout)


def test_every_command_is_classified_and_few_are_illustrative():
    cmds = _commands()
    assert len(cmds) >= 30
    illustrative = [c for _, c in cmds if _kind(c) == "illustrative" and not re.search(SETUP, c)]
    assert len(illustrative) <= 9, illustrative
    assert all(c.startswith(("rankcollapse", "echo")) for _, c in cmds if _kind(c) != "illustrative")


@pytest.mark.parametrize("doc,command", [c for c in _commands() if _kind(c[1]) == "fast"],
                         ids=lambda v: v if v.endswith(".md") else v[:60])
def test_fast_command_runs(doc, command, workdir):
    _run(_smaller(command), workdir)


@pytest.mark.slow
@pytest.mark.parametrize("doc,command", [c for c in _commands() if _kind(c[1]) == "slow"],
                         ids=lambda v: v if v.endswith(".md") else v[:60])
def test_slow_command_runs(doc, command, workdir):
    command = _smaller(command)
    # a run gets the smoke scale; `reproduce summary` reads a finished run and refuses
    # run options it would ignore
    if re.search(r"\breproduce\b", command) and "--scale" not in command and " summary " not in command:
        command += " --scale smoke"
    _run(command, workdir)


@pytest.mark.parametrize("doc", sorted({n for n, _, _ in _blocks("python")} - set(PY_ELSEWHERE)))
def test_python_blocks_run_in_order(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from rankcollapse.metrics import METRICS

    registered = dict(METRICS)
    namespace: dict = {"__name__": f"doc_{doc}"}
    try:
        for name, i, body in _blocks("python"):
            if name == doc:
                _run_python(body, f"{doc} block {i}", namespace)
    finally:  # a block may register a metric: leave the registry as it was
        METRICS.clear()
        METRICS.update(registered)


def _run_python(body: str, where: str, namespace: dict) -> None:
    """Run one block: a doctest (``>>>`` prompts) with its outputs checked, else plain code."""
    import doctest
    import io

    if not body.lstrip().startswith(">>>"):
        exec(compile(body, where, "exec"), namespace)
        return
    test = doctest.DocTestParser().get_doctest(body, namespace, where, where, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    runner.run(test, out=report.write, clear_globs=False)
    namespace.update(test.globs)  # the doctest ran on a copy: later blocks see its names
    assert runner.failures == 0, report.getvalue()


def test_a_doctest_block_checks_its_outputs():
    namespace: dict = {}
    _run_python(">>> x = 1 + 1\n>>> x\n2\n", "ok", namespace)
    assert namespace["x"] == 2
    with pytest.raises(AssertionError, match="Expected"):
        _run_python(">>> 1 + 1\n3\n", "wrong", {})


def test_readme_has_a_doctested_python_quickstart_and_stays_short():
    """The README is a front door: at most 12 KB, ``make demo`` and ``make test`` its first
    two commands, one doctested Python quickstart of about 15 lines."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 12 * 1024
    first = _FENCE.search(text)
    assert first.group(1) == "bash" and [ln.split()[:2] for ln in first.group(2).strip().splitlines()] == [
        ["make", "demo"], ["make", "test"]]
    (quick,) = [body for name, _, body in _blocks("python") if name == "README.md"]
    assert quick.lstrip().startswith(">>>") and 10 <= len(quick.strip().splitlines()) <= 20
