"""Lazy exports (PEP 562): a package lists them once as imports under ``if TYPE_CHECKING:``;
:func:`attach_imports` reads that block from the source (as ``lazy_loader.attach_stub`` reads
a stub) and imports each name on first access."""

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
    """``(__getattr__, __dir__, __all__)`` for ``package`` exporting the names of its
    ``init_file``'s export block (:func:`exports_of`); a listed submodule is an attribute too.
    ``ImportError``: a malformed block; ``__getattr__`` raises ``AttributeError`` for other names.
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
    """``{submodule: names}`` of the ``from .submodule import a, b`` under ``init_file``'s
    top-level ``if TYPE_CHECKING:``; ``ImportError`` when the block is missing, or holds anything
    but ``from .x import a, b`` without ``as``."""
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
    """True iff ``x`` is a ``torch.Tensor``, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)
