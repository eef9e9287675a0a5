"""The README's results table is the output of `reproduce summary` on a fresh quick run.

The table sits between the markers ``<!-- claims:start -->`` and ``<!-- claims:end -->``;
missing markers fail the test (nothing is skipped). Slow: a fresh ``reproduce all
--scale quick`` (run by CI's slow suite)."""

import re
from pathlib import Path

import pytest

from rankcollapse.experiments import runner
from rankcollapse.experiments.report import results_markdown

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_table(text: str) -> str:
    """The text between the claims markers (stripped), or AssertionError."""
    m = re.search(r"<!-- claims:start -->\n(.*?)<!-- claims:end -->", text, flags=re.S)
    assert m, "README.md has no <!-- claims:start --> ... <!-- claims:end --> block"
    return m.group(1).strip()


def test_marker_extraction():
    assert readme_table("x\n<!-- claims:start -->\n| a |\n<!-- claims:end -->\n") == "| a |"
    with pytest.raises(AssertionError, match="claims:start"):
        readme_table("no markers here")


@pytest.mark.slow
def test_readme_results_table_matches_a_fresh_quick_run(tmp_path):
    res = runner.run_experiment("all", "quick", tmp_path / "all", seed=0, cache_dir=tmp_path / "cache", progress=False)
    assert readme_table(README.read_text(encoding="utf-8")) == results_markdown(res.claims).strip()
