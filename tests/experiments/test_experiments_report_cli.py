"""Report in headless Chromium, and the command line's bad-input behaviour."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankcollapse import cli
from rankcollapse.experiments import runner


CHROMIUM = Path("/usr/bin/chromium")


def _chromium(path: Path) -> tuple[str, list[str]]:
    """(dumped DOM, console messages) of ``path`` loaded in headless Chromium."""
    proc = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=3000", "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    return proc.stdout, [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln]


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install -y chromium)")
def test_report_opens_in_chromium_without_console_errors(fake, tmp_path):
    res = runner.run_experiment("main", "smoke", tmp_path / "run", progress=False, nearby=False)
    bad = tmp_path / "bad.html"  # control: the console capture must see an error
    bad.write_text('<html><body><script>console.error("boom")</script></body></html>')
    assert any("boom" in m for m in _chromium(bad)[1])
    dom, console = _chromium(res.out / "report.html")
    assert console == []
    n_img = len(re.findall(r"<img ", dom))
    assert n_img >= 2
    assert f'data-images-ok="{n_img}"' in dom and 'data-images-bad="0"' in dom
    assert "Wikipedia" in dom and "CC BY-SA 4.0" in dom and res.config["config_hash"] in dom
    assert "Claims not reproduced under the defaults: evidence and nearby settings" in dom
    for c in res.claims:
        if c["verdict"] in ("not reproduced", "mixed"):
            assert f'id="nearby-{c["id"]}"' in dom


def _run_cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "reproduce", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["--mask", "nosuchmask"], "nosuchmask"),
    (["--mask", "sliding_window:w=4"], "w"),
    (["--length", "0"], "length"),
    (["--text", "/nonexistent/corpus.txt"], "corpus.txt"),
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
    code, err = _run_cli(monkeypatch, capsys, "--text", str(short), "--out", str(out), "--no-progress")
    lines = [ln for ln in err.splitlines() if ln.strip()]  # model loading draws no progress bar
    assert code == 2 and len(lines) == 1 and lines[0].startswith("rankcollapse: error:")
    assert "window" in lines[0] and str(short) in lines[0]
    assert not out.exists()
