"""The public surface: every export list is written once, every listed name imports,
and internals stay out of it."""

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

import rankcollapse
from rankcollapse._lazy import exports_of

LAZY = ["dynamics", "masks", "metrics", "models", "phase", "theory"]
INTERNALS = {"MaskInput", "empty_rows", "RankTolerance", "StopForward", "switch_attention", "parse_drop"}


def _type_checking_imports(init: Path) -> dict[str, list[str]]:
    """``{submodule: names}`` of the TYPE_CHECKING block, read here independently."""
    out: dict[str, list[str]] = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                out.setdefault(imp.module, []).extend(a.name for a in imp.names)
    return out


def test_root_exports_every_subpackage_phase_and_errors_included():
    assert {"phase", "errors"} <= set(rankcollapse.__all__)
    here = Path(rankcollapse.__file__).parent
    subpackages = {p.parent.name for p in here.glob("*/__init__.py")} - {"cli"}  # cli: the command line
    assert subpackages <= set(rankcollapse.__all__)
    for name in rankcollapse.__all__:
        assert isinstance(getattr(rankcollapse, name), ModuleType)
    assert rankcollapse.errors.MaskError.__mro__[1] is rankcollapse.errors.RankCollapseError
    assert set(rankcollapse.__all__) <= set(dir(rankcollapse))


@pytest.mark.parametrize("pkg", LAZY)
def test_lazy_export_list_is_the_type_checking_block(pkg):
    mod = importlib.import_module(f"rankcollapse.{pkg}")
    listed = _type_checking_imports(Path(mod.__file__))
    names = [n for ns in listed.values() for n in ns]
    assert len(names) == len(set(names)), "a name listed twice"
    assert mod.__all__ == sorted(names)
    for sub, ns in listed.items():
        home = importlib.import_module(f"rankcollapse.{pkg}.{sub}")
        for name in ns:
            assert getattr(mod, name) is getattr(home, name), f"{pkg}.{name}"


@pytest.mark.parametrize("pkg", LAZY + ["experiments"])
def test_every_name_in_all_imports_and_star_import_agrees(pkg):
    mod = importlib.import_module(f"rankcollapse.{pkg}")
    for name in mod.__all__:
        assert not name.startswith("_")
        getattr(mod, name)
    ns: dict = {}
    exec(f"from rankcollapse.{pkg} import *", ns)
    assert set(ns) - {"__builtins__"} == set(mod.__all__)
    assert set(mod.__all__) <= set(dir(mod))
    assert not INTERNALS & set(mod.__all__)


def test_eager_package_lists_what_it_imports():
    from rankcollapse import experiments

    bound = {n for n, v in vars(experiments).items() if not n.startswith("_") and not isinstance(v, ModuleType)}
    assert bound == set(experiments.__all__)


def test_an_export_block_that_is_not_plain_imports_is_refused(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x as y\n")
    with pytest.raises(ImportError, match="only 'from .submodule import name"):
        exports_of(init)
    init.write_text("X = 1\n")
    with pytest.raises(ImportError, match="one top-level 'if TYPE_CHECKING:' block"):
        exports_of(init)
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x, y\n    from .b import z\n")
    assert exports_of(init) == {"a": ("x", "y"), "b": ("z",)}


def _lazy_modules() -> list[ModuleType]:
    """Every module of the package with a lazy export list or forwarded (moved) names,
    found by walking the package rather than listed by hand."""
    import pkgutil

    found = []
    for info in pkgutil.walk_packages(rankcollapse.__path__, "rankcollapse."):
        if ".cli" in info.name or info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        if hasattr(mod, "_lazy_exports"):
            found.append(mod)
    return found


def test_every_name_of_every_lazy_export_list_resolves():
    mods = _lazy_modules()
    assert {"rankcollapse.sweep", "rankcollapse.masks"} <= {m.__name__ for m in mods}
    for mod in mods:
        for name in [*getattr(mod, "__all__", ()), *dir(mod)]:
            assert getattr(mod, name, None) is not None or name in vars(mod), f"{mod.__name__}.{name}"


def test_see_also_of_intervene_names_a_function_that_exists():
    from rankcollapse.models import intervene
    from rankcollapse.models.interventions import parse_drop

    assert "rankcollapse.models.interventions.parse_drop" in intervene.__doc__
    assert callable(parse_drop)
