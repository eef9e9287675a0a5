"""The token count is ``n_tokens`` in the whole mask API: a positional call and
``n_tokens=`` give the same result. The same for the token width ``d_model`` and the
number of samples ``n_samples`` in every public function of the package."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

from rankcollapse.dynamics import RunConfig
from rankcollapse.errors import RankCollapseError
from rankcollapse.masks import Mask, MaskAnalysis, MaskSchedule
from rankcollapse.masks import adapt, constructors as c, mask as mask_module, schedule, spec

N = 6


def _edge_file(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("".join(f"{i} {i}\n{i} 0\n" for i in range(N)))
    return path


def _fn(path):
    """The function ``module:name`` (imported when the case runs: theory imports torch)."""
    import importlib

    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


# (id, function, leading arguments (a callable of tmp_path: fresh per call), trailing
# positional arguments (a tuple, or a callable for fresh ones), keyword arguments, unused)
CASES = [
    ("complete", lambda: c.complete, lambda t: (), (), {}, "n"),
    ("causal", lambda: c.causal, lambda t: (), (), {}, "n"),
    ("sliding_window", lambda: c.sliding_window, lambda t: (), (3,), {}, "n"),
    ("causal_sliding_window", lambda: c.causal_sliding_window, lambda t: (), (2,), {}, "n"),
    ("dilated", lambda: c.dilated, lambda t: (), (3, 2), {"causal": True}, "n"),
    ("prefix", lambda: c.prefix, lambda t: (), (2,), {}, "n"),
    ("documents", lambda: c.documents, lambda t: (), ([2, 4],), {"causal": True}, "n"),
    ("block", lambda: c.block, lambda t: (), (4,), {}, "n"),
    ("closed", lambda: c.closed, lambda t: (), (), {"centers": [0], "radius": 1, "strongly": False}, "n"),
    ("strided", lambda: c.strided, lambda t: (), (2,), {}, "n"),
    ("fixed", lambda: c.fixed, lambda t: (), (3,), {"c": 2}, "n"),
    ("longformer", lambda: c.longformer, lambda t: (), (3,), {"globals": (0, 5)}, "n"),
    ("bigbird", lambda: c.bigbird, lambda t: (), (3,), {"globals": (0,), "random": 2, "seed": 3}, "n"),
    ("random", lambda: c.random, lambda t: (), (0.4,), {"seed": 1}, "n"),
    ("from_file", lambda: c.from_file, lambda t: (_edge_file(t),), (), {}, "n"),
    ("parse_mask", lambda: spec.parse_mask, lambda t: ("(causal|sliding_window:w=3)&block:size=4",), (), {}, "n"),
    ("parse_schedule", lambda: schedule.parse_schedule, lambda t: ("schedule:sliding_window:w=3*2,causal",), (), {},
     "n"),
    ("resolve_mask", lambda: adapt.resolve_mask, lambda t: ("causal_sliding_window:w=3",), (), {}, "n"),
    ("dense_mask", lambda: adapt.dense_mask, lambda t: ("prefix:k=2",), (), {"n_samples": 2}, "n"),
    ("Mask.from_edges", lambda: Mask.from_edges, lambda t: ([[i, max(i - 1, 0)] for i in range(N)],), (),
     {"spec": "e"}, "n"),
    ("normalise_csr", lambda: mask_module.normalise_csr, lambda t: (sp.eye_array(N, format="csr"),), (), {}, "n"),
    ("compare_masks", lambda: _fn("rankcollapse.theory.rates:compare_masks"), lambda t: (["causal", "sliding_window:w=3"],), (),
     {"d_qk": 4.0}, "n"),
    ("compare_schedules", lambda: _fn("rankcollapse.theory.rates:compare_schedules"),
     lambda t: (["schedule:sliding_window:w=3*2,complete", "causal"],), (), {}, "n"),
    ("describe_schedule", lambda: _fn("rankcollapse.theory.rates:describe_schedule"), lambda t: ("schedule:causal_sliding_window:w=2,complete",),
     (), {}, "n"),
    ("theorem1_terms", lambda: _fn("rankcollapse.theory.envelope:theorem1_terms"), lambda t: ("schedule:sliding_window:w=3,causal",), (), {},
     "n"),
    ("require_theorem1", lambda: _fn("rankcollapse.theory.envelope:require_theorem1"), lambda t: ("causal_sliding_window:w=2",), (), {}, "n"),
    ("construct_equilibrium", lambda: _fn("rankcollapse.theory.equilibria:construct_equilibrium"), lambda t: (),
     lambda: (_fn("rankcollapse.dynamics.weights:construction_eigenvalues")(3, 2), (1, -1)), {}, "n"),
    ("orthogonal_run", lambda: _fn("rankcollapse.theory.bound:orthogonal_run"), lambda t: (None, "causal"), (3,),
     {"n_samples": 2, "depth": 2, "d_qk": 1.0, "qk_scale": 1.0, "seed": 0}, "N"),
    ("make_inputs", lambda: _fn("rankcollapse.theory.sphere:make_inputs"), lambda t: ("sphere", 2), lambda: (3, torch.Generator().manual_seed(5)), {},
     "N"),
    ("allowed_keys", lambda: _fn("rankcollapse.models.probe:allowed_keys"),
     lambda t: ("bert", None, "sliding_window:w=3", "layer.1.attention"), (), {}, "n"),
    ("window_for_budget", lambda: _fn("rankcollapse.experiments.schedules:window_for_budget"),
     lambda t: ("causal_sliding_window:w={w}",), (12.0,), {}, "n"),
]


def _plain(x):
    """A result as nested plain data, compared with ``==`` (floats to the last bit)."""
    if isinstance(x, Mask):
        csr = x.to_csr()
        return ("Mask", x.spec, x.n_tokens, csr.indptr.tolist(), csr.indices.tolist())
    if isinstance(x, MaskSchedule):
        return ("MaskSchedule", x.spec, [_plain(m) for m in x.masks])
    if isinstance(x, MaskAnalysis):
        return ("MaskAnalysis", _plain(x.to_dict(per_token=True)))
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype), tuple(x.shape), x.flatten().tolist())
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape, x.ravel().tolist())
    if sp.issparse(x):
        return ("sparse", x.shape, x.indptr.tolist(), x.indices.tolist(), x.data.tolist())
    if isinstance(x, pd.DataFrame):
        return ("frame", list(x.columns), [str(t) for t in x.dtypes],
                _plain(x.astype(object).where(x.notna(), None).values.tolist()))
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if dataclasses.is_dataclass(x):
        return (type(x).__name__, _plain({f.name: getattr(x, f.name) for f in dataclasses.fields(x)}))
    return x


def _call(case, tmp_path, how):
    _, fn, lead, tail, kw, old = case
    f, lead, tail = fn(), lead(tmp_path), tail() if callable(tail) else tail
    if how == "position":
        return f(*lead, N, *tail, **kw)
    # a trailing positional argument cannot follow a keyword: pass the rest by name
    names = list(inspect.signature(f).parameters)
    rest = dict(zip(names[len(lead) + 1:], tail))
    return f(*lead, **{("n_tokens" if how == "new" else old): N}, **rest, **kw)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_n_tokens_by_position_and_by_name(case, tmp_path):
    assert _plain(_call(case, tmp_path, "new")) == _plain(_call(case, tmp_path, "position"))


#: the mask API, the theory and the other homes of a renamed token count
TOKEN_COUNT_MODULES = (
    ["rankcollapse.masks." + m for m in ("adapt", "constructors", "convert", "graph", "influence", "interval_graph",
                                         "mask", "rows", "schedule", "spec")]
    + ["rankcollapse.theory." + m for m in ("bound", "envelope", "equilibria", "rates", "sphere", "system")]
    + ["rankcollapse.models.probe", "rankcollapse.experiments.schedules", "rankcollapse.dynamics.inputs"])


def _public_functions(modules=TOKEN_COUNT_MODULES):
    """``(qualified name, function)`` of every public function and method of ``modules``."""
    import importlib

    for name in modules:
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isfunction(obj):
                yield f"{name}.{attr}", obj
            elif inspect.isclass(obj):
                for meth, fn in vars(obj).items():
                    fn = getattr(fn, "__func__", fn)
                    if not meth.startswith("_") and inspect.isfunction(fn):
                        yield f"{name}.{attr}.{meth}", fn


def test_no_public_function_takes_the_token_count_as_n():
    found = {qual: list(inspect.signature(fn).parameters) for qual, fn in _public_functions()}
    assert len(found) > 100
    assert [q for q, params in found.items() if {"n", "N"} & set(params)] == []


# --- the token width d_model (old d=) and the number of samples n_samples (old B=, batch=) ---

def _tokens_case(name):
    """A draw function of the input registry: ``(n_samples, n_tokens, d_model)`` by position."""
    return (f"dynamics.inputs.{name}", lambda: _fn(f"rankcollapse.dynamics.inputs:{name}"), lambda: (2, N, 3),
            {"seed": 4}, {"batch": "n_samples", "d": "d_model"})


def _run_context():
    from rankcollapse.sweep.context import RunContext

    return RunContext({})  # a fresh one per call: it caches its draws


# (id = the function's path below rankcollapse, function, positional arguments (fresh per
# call), keyword arguments, {old: new} of its renamed size arguments)
SIZE_CASES = [
    ("theory.rates.measure_rate", lambda: _fn("rankcollapse.theory.rates:measure_rate"),
     lambda: (schedule.parse_schedule("schedule:causal_sliding_window:w=2,complete", N),),
     {"run": RunConfig(depth=2, seed=1), "d_model": 3, "n_samples": 2, "quantiles": True}, {"d": "d_model"}),
    ("theory.rates.compare_schedules", lambda: _fn("rankcollapse.theory.rates:compare_schedules"),
     lambda: (["schedule:sliding_window:w=3*2,complete", "causal"], N),
     {"measure": RunConfig(depth=2), "d_model": 3, "n_samples": 2}, {"d": "d_model"}),
    ("theory.bound.orthogonal_run", lambda: _fn("rankcollapse.theory.bound:orthogonal_run"),
     lambda: (None, "causal", N, 3), {"n_samples": 2, "depth": 2, "d_qk": 1.0, "qk_scale": 1.0, "seed": 0},
     {"d": "d_model"}),
    ("theory.sphere.make_inputs", lambda: _fn("rankcollapse.theory.sphere:make_inputs"),
     lambda: ("nonnegative", 2, N, 3, torch.Generator().manual_seed(5)), {}, {"B": "n_samples", "d": "d_model"}),
    *[_tokens_case(name) for name in ("gaussian_tokens", "sphere_tokens", "hemisphere_tokens",
                                      "nonnegative_tokens", "antipodal_tokens", "simplex_tokens")],
    # the windows are drawn by seed: a generator is refused (no model is loaded), by every spelling
    ("dynamics.inputs.wikipedia_tokens", lambda: _fn("rankcollapse.dynamics.inputs:wikipedia_tokens"),
     lambda: (2, N, 3), {"generator": torch.Generator()}, {"batch": "n_samples", "d": "d_model"}),
    ("dynamics.inputs.make_tokens", lambda: _fn("rankcollapse.dynamics.inputs:make_tokens"),
     lambda: ("antipodal", 2, N, 3), {"seed": 2}, {"batch": "n_samples", "d": "d_model"}),
    ("phase.cell.make_input", lambda: _fn("rankcollapse.phase.cell:make_input"),
     lambda: ("hemisphere", 2, N, 3, 7), {}, {"batch": "n_samples", "d": "d_model"}),
    ("dynamics.weights.random_layers", lambda: _fn("rankcollapse.dynamics.weights:random_layers"),
     lambda: (4, 2), {"value": "orthogonal", "n_heads": 2, "mlp_ratio": 2, "seed": 3}, {"d": "d_model"}),
    ("dynamics.weights.construction_eigenvalues", lambda: _fn("rankcollapse.dynamics.weights:construction_eigenvalues"),
     lambda: (5, 3), {}, {"d": "d_model"}),
    ("sweep.context.RunContext.random_weights", lambda: _run_context().random_weights,
     lambda: (4, 2), {"seed": 1, "value": "gaussian", "query_key": "gaussian"}, {"d": "d_model"}),
    ("masks.adapt.dense_mask", lambda: adapt.dense_mask, lambda: (torch.ones(2, N, N, dtype=torch.bool).tril(), N),
     {"n_samples": 2}, {"batch": "n_samples"}),
]


def _size_forms(case):
    """``(function, args, kwargs, first, keyword)``: ``keyword`` holds every argument from
    the first renamed positional one on by name (``args[:first]`` stay positional)."""
    _, fn, args, kw, renames = case
    f, args = fn(), args()
    names = list(inspect.signature(f).parameters)
    first = min([i for i, name in enumerate(names[:len(args)]) if name in renames.values()], default=len(args))
    return f, args, kw, first, {**dict(zip(names[first:], args[first:])), **kw}


def _size_call(case, how):
    """Call ``case`` with its arguments as given (``position``) or by name from the first
    size argument on (``new``)."""
    f, args, kw, first, keyword = _size_forms(case)
    try:
        return _plain(f(*args, **kw) if how == "position" else f(*args[:first], **keyword))
    except RankCollapseError as exc:  # a refusal must read the same by every spelling
        return ("raised", type(exc).__name__, str(exc))


@pytest.mark.parametrize("case", SIZE_CASES, ids=[c[0] for c in SIZE_CASES])
def test_sizes_by_position_and_by_name(case):
    assert _size_call(case, "new") == _size_call(case, "position")


def _public_modules():
    """Every public module of the package (no ``_`` in its path), less the command line,
    whose command functions are called through their flags (tests/cli)."""
    import importlib
    import pkgutil

    import rankcollapse

    todo, found = [rankcollapse], []
    while todo:
        pkg = todo.pop()
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1].startswith("_") or info.name == "rankcollapse.cli":
                continue
            found.append(info.name)
            if info.ispkg:
                todo.append(importlib.import_module(info.name))
    return found


#: public parameters spelt d/B/batch that are not the token width or the samples, and why
NOT_SIZES = {
    ("rankcollapse.dynamics.weights.haar_orthogonal", "d"): "the dimension of the group O(d) drawn from",
    ("rankcollapse.dynamics.weights.haar_orthogonal", "batch"): "a shape tuple (leading dimensions), not a count",
}


def test_no_public_function_takes_the_width_as_d_or_the_samples_as_b():
    found = dict(_public_functions(_public_modules()))
    assert len(found) > 400
    spelt = {(q, p) for q, fn in found.items() for p in inspect.signature(fn).parameters if p in ("d", "B", "batch")}
    assert spelt == set(NOT_SIZES)
