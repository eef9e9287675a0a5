"""Package-level lazy imports (PEP 562) for the subpackages' public names.

``import rankcollapse.models`` must not pull in pandas, scipy or the model code until a
name is used (the command line starts in well under a second), yet each package's
``__init__`` should show what it exports and from where. A package writes its exports
once, as ordinary imports under ``if TYPE_CHECKING:`` (read by people and static tools,
never run), and calls :func:`attach_imports`, which reads that block from the source
(as ``lazy_loader.attach_stub`` reads a ``.pyi`` stub): the names are imported on first
access and cached.

One subtlety: an export may share its name with its submodule (``models.probe`` the
function lives in ``models/probe.py``). Python binds a submodule to its parent's
attribute when it is first imported, which would shadow the function; the package's
module class below binds the export instead.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path
from typing import Callable


class _LazyPackage(types.ModuleType):
    """Module class of a lazy package: a submodule never shadows an export of the same name."""

    _lazy_exports: dict[str, str] = {}

    def __setattr__(self, name: str, value: object) -> None:
        home = self._lazy_exports.get(name)
        if home == name and isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            value = getattr(value, name)  # the import system binds the (fully run) submodule
        super().__setattr__(name, value)


def attach_imports(package: str, init_file: str
                   ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` exporting the names written
    once under ``if TYPE_CHECKING:`` in ``init_file`` (:func:`exports_of`); call as
    ``__getattr__, __dir__, __all__ = attach_imports(__name__, __file__)``. A submodule
    listed there is also reachable as an attribute (``theory.sphere.INPUTS``) unless an
    export has its name.

    Raises
    ------
    AttributeError
        From ``__getattr__``, for a name the package does not export.
    ImportError
        A malformed export block (:func:`exports_of`).
    """
    exports = exports_of(init_file)
    where = {name: sub for sub, names in exports.items() for name in names}
    module = sys.modules[package]
    module.__class__ = _LazyPackage
    object.__setattr__(module, "_lazy_exports", where)

    def __getattr__(name: str) -> object:
        if name not in where:
            if name in exports:  # a submodule without an export of its name: the module
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        setattr(module, name, value)  # cache: later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | set(where))

    return __getattr__, __dir__, sorted(where)


def exports_of(init_file: str | Path) -> dict[str, tuple[str, ...]]:
    """``{submodule: names}`` of the ``from .submodule import a, b`` statements under the
    top-level ``if TYPE_CHECKING:`` of the package file ``init_file``.

    Raises
    ------
    ImportError
        The block is missing, or holds anything but relative ``from .x import a, b``
        imports without ``as`` (the export list must read as what it exports).
    """
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    blocks = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
              and node.test.id == "TYPE_CHECKING"]
    if len(blocks) != 1:
        raise ImportError(f"{init_file}: one top-level 'if TYPE_CHECKING:' block of exports expected")
    exports: dict[str, tuple[str, ...]] = {}
    for stmt in blocks[0].body:
        if not (isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module
                and all(a.asname is None and a.name != "*" for a in stmt.names)):
            raise ImportError(f"{init_file}:{stmt.lineno}: only 'from .submodule import name, ...' may list exports")
        exports[stmt.module] = exports.get(stmt.module, ()) + tuple(a.name for a in stmt.names)
    return exports


def is_tensor(x: object) -> bool:
    """True iff ``x`` is a ``torch.Tensor``, checked without importing torch: if torch
    was never imported, nothing can be a tensor (so a torch-free code path stays so)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
