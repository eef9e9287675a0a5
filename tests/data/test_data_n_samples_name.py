"""The number of windows is ``n_samples`` everywhere: no public function names it otherwise."""

from __future__ import annotations

import importlib
import inspect
import pkgutil


def test_no_public_function_takes_the_samples_as_n_windows():
    import rankcollapse

    todo, found = [rankcollapse], {}
    while todo:
        pkg = todo.pop()
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1].startswith("_") or info.name == "rankcollapse.cli":
                continue
            mod = importlib.import_module(info.name)
            if info.ispkg:
                todo.append(mod)
            for attr, obj in vars(mod).items():
                if attr.startswith("_") or getattr(obj, "__module__", None) != info.name:
                    continue
                members = [(attr, obj)] if inspect.isfunction(obj) else [
                    (f"{attr}.{m}", getattr(fn, "__func__", fn)) for m, fn in vars(obj).items()
                    if inspect.isclass(obj) and not m.startswith("_")]
                found.update({f"{info.name}.{q}": fn for q, fn in members if inspect.isfunction(fn)})
    assert len(found) > 400
    assert [q for q, fn in found.items() if "n_windows" in inspect.signature(fn).parameters] == []
