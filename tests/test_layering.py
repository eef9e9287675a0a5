"""Which subpackage may import which: the import-linter contracts of pyproject.toml.

``layers``: cli > experiments > phase > sweep > theory > dynamics > models > metrics >
masks > data, points > assets > private utilities > _io > errors; a module imports only
from its own layer or below (so ``masks`` imports neither ``dynamics`` nor ``theory``).
Each contract is checked on the source tree by import-linter (static imports, those
inside functions included).
"""

from pathlib import Path

import pytest

importlinter_cli = pytest.importorskip("importlinter.cli")

CONFIG = str(Path(__file__).resolve().parents[1] / "pyproject.toml")


def lint(contract: str) -> int:
    return importlinter_cli.lint_imports(config_filename=CONFIG, limit_to_contracts=(contract,), no_cache=True,
                                         no_logo=True)


def test_subpackage_layers_hold():
    assert lint("layers") == 0  # the broken imports are printed above


def test_no_import_cycle():
    assert lint("acyclic") == 0


def test_a_forbidden_import_is_caught(tmp_path, monkeypatch):
    """The layers contract sees an import that goes up (masks -> theory), also one inside a function."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "src" / "rankcollapse"
    copy = tmp_path / "rankcollapse"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__", "configs", "templates"))
    with open(copy / "masks" / "rows.py", "a") as f:
        f.write("\n\ndef _up():\n    from ..theory.envelope import EXPONENTS\n    return EXPONENTS\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in __import__("sys").modules if m == "rankcollapse" or m.startswith("rankcollapse.")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    assert lint("layers") != 0
