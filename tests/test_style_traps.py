"""Style traps kept out of the source (docs/style.md): private framework modules used from
one module only, with the framework pinned to the versions it supports; no exception
matched by its class name."""

import ast
import re
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rankcollapse"
PYPROJECT = ROOT / "pyproject.toml"


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _imports_typer_click(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("typer._click") or (node.module == "typer" and
                                                           any(a.name == "_click" for a in node.names)):
                return True
        if isinstance(node, ast.Import) and any(a.name.startswith("typer._click") for a in node.names):
            return True
    return False


def test_typer_vendored_click_is_imported_in_one_module():
    users = [p.relative_to(SRC).as_posix() for p, tree in _modules() if _imports_typer_click(tree)]
    assert users == ["cli/_click.py"]


def test_typer_is_pinned_to_the_versions_cli_click_supports():
    pins = re.findall(r'"typer([^"]*)"', PYPROJECT.read_text())
    assert pins == [">=0.26,<0.30"]  # typer vendors click as typer._click from 0.26.0
    major, minor = (int(x) for x in version("typer").split(".")[:2])
    assert (0, 26) <= (major, minor) < (0, 30)


def _name_of_type_compare(node: ast.AST) -> bool:
    """``type(x).__name__ == ...`` or ``x.__class__.__name__ == ...`` (or ``in``/``!=``)."""
    if not isinstance(node, ast.Compare):
        return False
    for side in (node.left, *node.comparators):
        if isinstance(side, ast.Attribute) and side.attr == "__name__":
            inner = side.value
            if isinstance(inner, ast.Call) and getattr(inner.func, "id", None) == "type":
                return True
            if isinstance(inner, ast.Attribute) and inner.attr == "__class__":
                return True
    return False


def test_no_exception_is_matched_by_its_class_name():
    found = [f"{p.relative_to(SRC)}:{n.lineno}" for p, tree in _modules() for n in ast.walk(tree)
             if _name_of_type_compare(n)]
    assert found == []
