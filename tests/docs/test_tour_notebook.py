"""examples/tour.ipynb is stored without outputs and runs top to bottom (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "tour.ipynb"


def test_tour_is_stored_without_outputs():
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 10
    assert all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow  # loads MiniLM; about 15 s on an idle 2-core machine
def test_tour_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env_path = os.environ.get("PYTHONPATH", "")
    # the kernel is a child process: it imports this tree
    monkeypatch.setenv("PYTHONPATH", src + (os.pathsep + env_path if env_path else ""))
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # masks, simulate, res.plot, probe, influence
    text = "\n".join(o.get("data", {}).get("text/plain", "") + o.get("text", "") for o in outputs)
    for shown in ("effective_radius", "first_token_mass", "sink_mass", "sink_contribution", "max_norm_ratio"):
        assert shown in text  # schedules, influence, sinks and massive tokens
    verdicts = nb.cells[-1].outputs[0]["data"]["text/plain"]
    assert "C" in verdicts and any(v in verdicts for v in ("reproduced", "mixed", "not run"))
