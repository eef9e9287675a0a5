"""The public surface stays small: no public function outside the command line takes more
than 10 parameters (pass config objects: BlockConfig, RunConfig, ...)."""

import ast
from pathlib import Path

import rankcollapse

MAX_PARAMETERS = 10
PACKAGE = Path(rankcollapse.__file__).parent


def _count(args: ast.arguments) -> int:
    """Every parameter a caller can give (positional-only, ordinary, keyword-only, ``*args``,
    ``**kwargs``), less ``self``/``cls``."""
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def _public_functions(tree: ast.Module):
    """``(qualified name, node)`` of the module's public functions and public methods of its
    public classes (nested functions are private to their function)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def _violations() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "cli":
            continue
        for name, node in _public_functions(ast.parse(path.read_text(encoding="utf-8"))):
            n = _count(node.args)
            if n > MAX_PARAMETERS:
                out.append(f"{rel.as_posix()}:{node.lineno} {name} takes {n} parameters")
    return out


def test_the_count_follows_the_rule():
    tree = ast.parse("def f(a, /, b, *c, d, **e): ...\nclass K:\n    def m(self, a): ...\n    def _p(self, *a): ...")
    assert [(name, _count(node.args)) for name, node in _public_functions(tree)] == [("f", 5), ("K.m", 1)]


def test_no_public_function_takes_more_than_ten_parameters():
    assert _violations() == []
