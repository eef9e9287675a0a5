"""One flag name per concept: any other spelling is an unknown option; --out is a folder
with fixed file names; strict JSON; help fits 100 columns; tables off a terminal keep
whole names."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from rankcollapse.cli import app
from rankcollapse.cli._output import dumps, print_json

from ._harness import _reject, invoke


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    rng = np.random.default_rng(0)
    np.save(root / "x.npy", rng.standard_normal((3, 6, 4)))
    np.save(root / "zeros.npy", np.zeros((2, 6, 4)))
    return root


def _strict(text: str):
    return json.loads(text, parse_constant=_reject)


#: spellings that are not flags of any command (the vocabulary of docs/cli.md has one name per concept)
NOT_FLAGS = [
    ["mask", "describe", "causal", "--n", "6"],
    ["mask", "describe", "causal", "--n-tokens", "6", "--json"],
    ["metrics", "x.npy", "--names", "mu,avg_cos"],
    ["simulate", "--length", "8", "--depth", "2"],
    ["simulate", "--n-tokens", "8", "--qk-scale", "2"],
    ["theory", "bound", "--n-tokens", "8", "--d", "4"],
    ["theory", "bound", "--n-tokens", "8", "--samples", "2"],
    ["probe", "--model", "minilm", "--windows", "2"],
    ["probe", "--model", "minilm", "--d-qk-scale", "4"],
]


@pytest.mark.parametrize("argv", NOT_FLAGS, ids=[" ".join(a) for a in NOT_FLAGS])
def test_a_spelling_that_is_not_a_flag_is_a_usage_error(root, argv):
    code, out, err = invoke(argv, root)
    assert code == 2 and out == "" and "No such option" in err


def test_help_hides_the_old_spellings(root):
    old = re.compile(r"(?<![\w-])--(n|d|length|windows|samples|names|pretrained|json|text|d-qk-scale)(?![\w-])")
    for argv in _commands():
        code, out, _ = invoke([*argv, "--help"], root)
        assert code == 0 and not old.search(out), (argv, old.search(out))


def _commands() -> list[list[str]]:
    """Every leaf command, e.g. ``["mask", "show"]``, ``["metrics"]``."""
    import typer.main

    found = []
    for name, cmd in typer.main.get_command(app).commands.items():
        subs = getattr(cmd, "commands", None)
        found += [[name, s] for s in subs] if subs else [[name]]
    return found


def test_every_command_is_listed():
    names = {" ".join(c) for c in _commands()}
    assert {"mask describe", "mask show", "mask compare", "metrics", "simulate", "probe", "phase", "theory bound",
            "theory system", "theory find", "theory basin", "reproduce"} <= names


_BOX = re.compile(r"[^\s│╭╮╰╯─┃━┏┓┗┛]+")


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a))
def test_help_fits_100_columns_without_cutting_words(root, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "100")
    code, narrow, _ = invoke([*argv, "--help"], root)
    assert code == 0
    assert max(len(line) for line in narrow.splitlines()) <= 100
    monkeypatch.setenv("COLUMNS", "2000")
    _, wide, _ = invoke([*argv, "--help"], root)
    # the same words in the same order: wrapping moved whole words, never split one
    assert _BOX.findall(narrow) == _BOX.findall(wide)


@pytest.mark.parametrize("argv", [*_commands(), []], ids=lambda a: " ".join(a) or "root")
def test_help_paragraphs_reflow_and_keep_every_word(root, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "2000")
    code, out, _ = invoke([*argv, "--help"], root)
    assert code == 0
    prose = [line.strip() for line in out.splitlines() if not line.strip()[:1] in ("│", "╭", "╰")]
    # wide enough for any paragraph: a paragraph that keeps its source line breaks prints ragged
    assert not [(a, b) for a, b in zip(prose, prose[1:]) if a and b], argv


def test_help_keeps_bracketed_words_and_lists_commands_by_their_short_help(root, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")
    listing = {line.strip("│ ").split()[0]: line.strip("│ ") for line in invoke(["--help"], root)[1].splitlines()
               if line.startswith("│ ") and not line.strip("│ ").startswith("--")}
    assert {"metrics", "reproduce", "mask"} <= set(listing) and max(map(len, listing.values())) < 160
    assert "main by default" in invoke(["reproduce", "--help"], root)[1]
    assert "(M_ij = 1)" in invoke(["mask", "--help"], root)[1]


def test_mask_show_out_is_a_folder(root):
    code, _, err = invoke(["mask", "show", "causal", "--n-tokens", "8", "--out", "shown"], root)
    assert code == 0 and (root / "shown" / "mask.png").stat().st_size > 0
    code, _, _ = invoke(["mask", "show", "causal", "--n-tokens", "8", "--out", "svg", "--image-format", "svg"], root)
    assert code == 0 and (root / "svg" / "mask.svg").read_text().lstrip().startswith("<?xml")


def test_mask_compare_out_folder_holds_compare_csv(root):
    argv = ["mask", "compare", "causal", "complete", "--n-tokens", "8"]
    assert invoke([*argv, "--out", "cmp"], root)[0] == 0
    _, csv_out, _ = invoke([*argv, "--format", "csv"], root)
    written = (root / "cmp" / "compare.csv").read_text().splitlines()
    assert csv_out.splitlines()[0] == written[0] and written[0].startswith("spec,n_tokens,n_edges")
    assert len(csv_out.splitlines()) == len(written) == 3


@pytest.mark.parametrize("extra", [["--depth", "4"], ["--seed", "1"], ["--n-samples", "2"], ["--d-model", "8"]])
def test_mask_compare_refuses_measure_settings_without_measure(root, extra):
    code, out, err = invoke(["mask", "compare", "causal", "--n-tokens", "8", *extra], root)
    assert code == 2 and not out and f"{extra[0]} does not apply here" in err
    assert invoke(["mask", "compare", "causal", "--n-tokens", "4", "--measure", *extra], root)[0] == 0


def test_mask_compare_refuses_max_memory_for_the_schedule_table(root):
    code, _, err = invoke(["mask", "compare", "schedule:causal*2,complete", "--n-tokens", "8", "--max-memory", "1GiB"],
                          root)
    assert code == 2 and "--max-memory does not apply here" in err
    assert invoke(["mask", "compare", "causal", "--n-tokens", "8", "--max-memory", "1GiB"], root)[0] == 0


def test_markdown_and_csv_have_one_row_per_record(root):
    _, md, _ = invoke(["metrics", "x.npy", "--metrics", "mu,rank_fraction", "--format", "markdown"], root)
    lines = md.splitlines()
    assert lines[0] == "| mu | rank_fraction |" and lines[1] == "| --- | --- |" and len(lines) == 2 + 3
    _, js, _ = invoke(["metrics", "x.npy", "--metrics", "mu", "--format", "json"], root)
    _, csv_out, _ = invoke(["metrics", "x.npy", "--metrics", "mu", "--format", "csv"], root)
    assert [float(v) for v in csv_out.split()[1:]] == pytest.approx([r["mu"] for r in _strict(js)], rel=1e-5)


def test_unknown_format_is_one_line_exit_2(root):
    code, out, err = invoke(["theory", "equilibria", "--format", "csv"], root)
    assert code == 2 and out == ""
    assert err.strip() == "rankcollapse: error: --format must be one of table, json here, got 'csv'"


def test_tables_off_a_terminal_keep_whole_names(root, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # a narrow pipe must not matter
    _, out, _ = invoke(["metrics", "zeros.npy"], root)
    assert "…" not in out
    for name in ("dong_residual_relative", "mean_average_distance", "undefined"):
        assert name in out
    _, out, _ = invoke(["mask", "compare", "causal", "schedule:sliding_window:w=3*2,complete", "--n-tokens", "16"],
                       root)
    assert "…" not in out and "schedule:sliding_window:w=3*2,complete" in out and "log10 layers/10x" in out


STRICT_JSON = [
    ["mask", "describe", "causal", "--n-tokens", "6", "--format", "json"],
    ["mask", "describe", "schedule:sliding_window:w=3*2,complete", "--n-tokens", "6", "--format", "json"],
    ["mask", "compare", "causal", "complete", "--n-tokens", "6", "--format", "json"],
    ["metrics", "zeros.npy", "--format", "json"],
    ["simulate", "--n-tokens", "6", "--depth", "2", "--d-model", "3", "--format", "json", "--out", "sim"],
    ["theory", "bound", "--n-tokens", "6", "--d-model", "3", "--widths", "6,2", "--depth", "4", "--n-samples", "2",
     "--format", "json"],
    ["theory", "equilibria", "--format", "json"],
    ["theory", "system", "--out", "sys", "--format", "json"],
    ["theory", "find", "--system", "sys/system.json", "--starts", "4", "--format", "json"],
    ["theory", "basin", "--n-samples", "50", "--depth", "200", "--format", "json"],
    ["theory", "sphere", "--n-tokens", "4", "--d-model", "3", "--depth", "4", "--format", "json"],
    ["phase", "--axis", "d_qk=1,4", "--depth", "3", "--n-tokens", "6", "--d-model", "3", "--n-samples", "2",
     "--out", "ph", "--format", "json"],
]


def test_every_json_the_cli_prints_or_writes_is_strict(root):
    for argv in STRICT_JSON:  # in order: theory find reads the system theory system wrote
        code, out, err = invoke(argv, root)
        assert code == 0, (argv, err)
        _strict(out)
    assert _strict((root / "sim" / "result.json").read_text())["layers"][0]["epsilon_measured"] is None  # no layer yet
    assert _strict((root / "sys" / "system.json").read_text())["W_V"] == [[1.0, -3.0], [0.0, 2.0]]
    for path in (root / "ph").rglob("*.json"):
        _strict(path.read_text())


def test_json_helpers_turn_non_finite_numbers_into_null(capsys):
    import torch

    from rankcollapse._io import write_json_atomic

    obj = {"a": math.nan, "b": np.float32("inf"), "c": torch.tensor([1.0, -math.inf]), "d": [np.int64(3)]}
    assert _strict(dumps(obj)) == {"a": None, "b": None, "c": [1.0, None], "d": [3]}
    print_json(obj)
    assert _strict(capsys.readouterr().out)["c"] == [1.0, None]


def test_write_json_atomic_is_strict(tmp_path):
    from rankcollapse._io import write_json_atomic

    write_json_atomic(tmp_path / "a.json", {"x": [math.nan, 1.5, math.inf]})
    assert _strict((tmp_path / "a.json").read_text()) == {"x": [None, 1.5, None]}


def test_theory_system_feeds_find_and_basin(root):
    code, out, _ = invoke(["theory", "system", "--out", "sys2"], root)
    assert code == 0 and "sys2/system.json" in out
    code, out, err = invoke(["theory", "basin", "--system", "sys2/system.json", "--n-samples", "100", "--depth", "200",
                             "--format", "json"], root)
    code_d, out_d, _ = invoke(["theory", "basin", "--n-samples", "100", "--depth", "200", "--format", "json"], root)
    assert code == code_d == 0, err
    # the written system is the default N = d = 2 example: the same estimate
    assert _strict(out)["fraction"] == _strict(out_d)["fraction"]


@pytest.mark.slow
def test_probe_d_qk(root):
    """probe --d-qk D scores q·k / sqrt(D) (MiniLM: d_qk = d_head = 32, so D = 128 is d_qk_scale 4)."""
    new = ["probe", "--model", "minilm", "--n-samples", "2", "--n-tokens", "16", "--d-qk", "128", "--format", "json"]
    code, out, err = invoke(new, root)
    assert code == 0, err
    b = _strict(out)
    assert b["d_qk_scale"] == pytest.approx(4.0, rel=1e-12) and b["d_qk"] == 128.0
    code, out, _ = invoke(["probe", "--model", "minilm", "--n-samples", "2", "--n-tokens", "16"], root)
    assert code == 0 and "…" not in out and "embeddings" in out and "mu_relative" in out
    code, _, err = invoke(["probe", "--n-samples", "2"], root)
    assert code == 2 and "missing --model" in err


@pytest.mark.parametrize("argv, want, api", [
    (["mask", "influence", "file:M.npy", "--n-tokens", "7", "--depth", "2", "--alpha", "0.5"],
     "--n-tokens is 7, but mask file 'M.npy' has N=5 tokens", "n_tokens"),
    (["simulate", "--attention", "offbyone", "--backend", "blocked", "--n-tokens", "8", "--depth", "1"],
     "--backend 'blocked' cannot run attention 'sink:b=0' (the windowed and FlexAttention kernels compute softmax); "
     "use dense or auto", "error: backend"),
    (["simulate", "--qk-norm-scale", "3", "--n-tokens", "8", "--depth", "1"], "--qk-norm-scale is a setting of the query-key normalisation",
     "qk_norm_scale"),
    (["mask", "influence", "causal", "--n-tokens", "1000000", "--depth", "100000", "--alpha", "0.5"],
     "error: --max-memory ", "max_memory"),
])
def test_errors_name_the_flags_not_the_api_arguments(tmp_path, argv, want, api):
    np.save(tmp_path / "M.npy", np.tril(np.ones((5, 5), dtype=bool)))
    code, _, err = invoke(argv, tmp_path)
    assert code == 2 and err.count("\n") == 1, err
    assert want in err and api not in err, err
