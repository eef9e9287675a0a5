"""Report in headless Chromium, and the command line's bad-input behaviour."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rankcollapse import cli


CHROMIUM = Path(shutil.which("chromium") or "/usr/bin/chromium")


def _chromium(path: Path) -> tuple[str, list[str]]:
    """(dumped DOM, console messages) of ``path`` loaded in headless Chromium."""
    proc = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=3000", "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    return proc.stdout, [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]


@pytest.mark.slow  # reads the whole `all` smoke run: CI runs it with the slow tests
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium on PATH: `make browser` installs it (apt-get, as root)")
def test_report_opens_in_chromium_without_console_errors(all_smoke, tmp_path):
    res = all_smoke  # every experiment's claims and figures in one report
    bad = tmp_path / "bad.html"  # control: the console capture must see an error
    bad.write_text('<html><body><script>console.error("boom")</script></body></html>')
    assert any("boom" in m for m in _chromium(bad)[1])
    dom, console = _chromium(res.out / "report.html")
    assert console == []
    n_img = len(re.findall(r"<img ", dom))
    assert n_img >= 2
    assert f'data-images-ok="{n_img}"' in dom and 'data-images-bad="0"' in dom
    assert "Wikipedia" in dom and "CC BY-SA 4.0" in dom and res.config["config_hash"] in dom
    # scorecard first: every claim with its verdict, decisive number and a link to its section
    score = dom[dom.index('id="scorecard"'):dom.index("<h2>Claims</h2>")]
    for c in res.claims:
        assert f'href="#claim-{c["id"]}"' in score and f'id="claim-{c["id"]}"' in dom
    assert "<th>Config hash</th>" in dom and "{&quot;" not in dom  # labelled fields, no raw JSON dicts
    assert "<summary>experiment configs (YAML)</summary>" in dom


def _run_cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "reproduce", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["--mask", "nosuchmask"], "nosuchmask"),
    (["--mask", "sliding_window:w=4"], "w"),
    (["--n-tokens", "0"], "--n-tokens"),
    (["--text-file", "/nonexistent/corpus.txt"], "corpus.txt"),
    (["nosuchexperiment"], "nosuchexperiment"),
    (["--scale", "huge"], "huge"),
    (["--depth", "0"], "depth"),
])
def test_bad_input_one_line_exit_2_no_output(monkeypatch, capsys, tmp_path, args, needle):
    out = tmp_path / "out"
    code, err = _run_cli(monkeypatch, capsys, *args, "--out", str(out), "--no-progress")
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rankcollapse: error:") and needle in lines[0]
    assert "Traceback" not in err
    assert not out.exists()


def test_text_shorter_than_window(monkeypatch, capsys, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("a few words only\n")
    out = tmp_path / "out"
    code, err = _run_cli(monkeypatch, capsys, "--text-file", str(short), "--out", str(out), "--no-progress")
    lines = [ln for ln in err.splitlines() if ln.strip()]  # model loading draws no progress bar
    assert code == 2 and len(lines) == 1 and lines[0].startswith("rankcollapse: error:")
    assert "window" in lines[0] and str(short) in lines[0]
    assert not out.exists()


def test_summary_prints_the_results_table(fig3_seed3, monkeypatch, capsys, tmp_path):
    import json

    res = fig3_seed3[0]
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "reproduce", "summary", str(res.out), "--format", "markdown"])
    cli.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| id | effect (paper) | verdict |") and len(out) == 2 + len(res.claims)
    assert all(row.startswith(f"| {c['id']} | ") for row, c in zip(out[2:], res.claims))
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "reproduce", "summary", str(res.out), "--format", "json"])
    cli.main()
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [c["id"] for c in res.claims]
    assert {"verdict", "measured", "interval", "depth", "n_samples", "n_seeds", "original_verdict"} <= set(rows[0])
    code, err = _run_cli(monkeypatch, capsys, "summary", str(tmp_path / "nothing"))
    assert code == 2 and "claims.json" in err


@pytest.mark.slow  # reads the whole `all` smoke run: CI runs it with the slow tests
def test_claims_json_has_the_interface_fields(all_smoke):
    import json

    res = all_smoke
    claims = json.loads(json.dumps(res.claims))  # what write_outputs stores
    need = {"id", "effect", "verdict", "measured", "rule", "interval", "depth", "n_samples", "n_seeds", "original_verdict"}
    for c in claims:
        assert need <= set(c), c["id"]
        assert c["interval"] is None or len(c["interval"]) == 2
        if c["original_verdict"] is not None:
            assert c["change_reason"] and c["original_rule"]
    assert {c["id"] for c in claims if c["original_verdict"]} == {"C02", "C03", "C05", "C08", "C09", "C10", "C11", "C12", "G2", "G4", "I3", "I4"}
