"""The entry points' docstrings: a See Also section and one Example each, run here as
doctests (tiny config-built models, no download)."""

import doctest
import importlib
import io

import pytest

ENTRY_POINTS = [
    "rankcollapse.masks.spec:parse_mask",
    "rankcollapse.masks.graph:analyze",
    "rankcollapse.masks.adapt:resolve_mask",
    "rankcollapse.metrics.registry:compute_metrics",
    "rankcollapse.metrics.registry:register_metric",
    "rankcollapse.dynamics.runner:simulate",
    "rankcollapse.models.probe:probe",
    "rankcollapse.models.recorder:Recorder",
    "rankcollapse.theory.bound:check_collapse_bound",
    "rankcollapse.experiments.runner:run_experiment",
    "rankcollapse.phase.sweep:run_phase",
    "rankcollapse.models.loading:load_model",
    "rankcollapse.data:make_windows",
    "rankcollapse.models.interventions:intervene",
    "rankcollapse.models.patching:patch",
]


@pytest.mark.parametrize("where", ENTRY_POINTS)
def test_entry_point_documents_see_also_and_runs_its_example(where):
    module_name, name = where.split(":")
    module = importlib.import_module(module_name)
    obj = getattr(module, name)
    assert "\n    See Also\n    --------\n" in obj.__doc__
    tests = doctest.DocTestFinder(recurse=False).find(obj, name, module=module, globs=vars(module).copy())
    assert sum(len(t.examples) for t in tests) >= 2, "no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    for test in tests:
        runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()
