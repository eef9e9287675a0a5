"""A mask reaches ``simulate`` as one Mask: a spec is parsed exactly once, and every
accepted form (spec, Mask, bool tensor/array, scipy sparse, schedule) runs the same."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from rankcollapse import theory
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.masks import Mask, causal, parse_schedule
from rankcollapse.masks import spec as spec_module

N = 6
TRIL = np.tril(np.ones((N, N), dtype=bool))


@pytest.fixture
def parsed(monkeypatch):
    """The spec atoms parsed (every spec is parsed through ``spec._parse_atom``)."""
    calls: list[str] = []
    real = spec_module._parse_atom

    def counting(atom, n):
        calls.append(atom)
        return real(atom, n)

    monkeypatch.setattr(spec_module, "_parse_atom", counting)
    return calls


def _X():
    return torch.randn(2, N, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("spec, atoms", [
    ("causal", ["causal"]),
    ("causal&sliding_window:w=3", ["causal", "sliding_window:w=3"]),
    ("schedule:causal*2,complete", ["causal", "complete"]),
])
def test_a_spec_going_into_simulate_is_parsed_exactly_once(parsed, spec, atoms):
    simulate(_X(), mask=spec, metrics=["mu", "dirichlet_energy"], run=RunConfig(depth=3))
    assert parsed == atoms


def test_the_theorem1_check_parses_its_spec_once(parsed):
    theory.check_collapse_bound("causal_sliding_window:w=2", n_tokens=N, d_model=4, depth=2, n_samples=2)
    assert parsed == ["causal_sliding_window:w=2"]


@pytest.mark.parametrize("form, spec", [
    (lambda: "causal", "causal"),
    (lambda: causal(N), "causal"),
    (lambda: torch.from_numpy(TRIL), f"dense:n={N}"),
    (lambda: TRIL, f"dense:n={N}"),
    (lambda: TRIL.astype(np.int64), f"dense:n={N}"),
    (lambda: sp.csr_array(TRIL), f"sparse:n={N}"),
    (lambda: sp.coo_matrix(TRIL), f"sparse:n={N}"),
    (lambda: ["causal"], "schedule:causal"),
])
@pytest.mark.parametrize("backend", ["dense", "blocked"])
def test_every_mask_form_runs_the_same(form, spec, backend):
    want = simulate(_X(), mask="causal", metrics=["mu", "dirichlet_energy"], run=RunConfig(depth=3, backend=backend, record_epsilon=True))
    got = simulate(_X(), mask=form(), metrics=["mu", "dirichlet_energy"], run=RunConfig(depth=3, backend=backend, record_epsilon=True))
    for k in want.metrics:
        assert torch.equal(got.metrics[k], want.metrics[k])
    assert torch.equal(got.epsilon_measured, want.epsilon_measured)
    assert got.config["mask"] == spec


def test_a_schedule_object_runs_layer_by_layer():
    sched = parse_schedule("schedule:causal,complete", N)
    a = simulate(_X(), mask=sched, metrics=["mu"], run=RunConfig(depth=4, record_attention=True))
    b = simulate(_X(), mask="schedule:causal,complete", metrics=["mu"], run=RunConfig(depth=4, record_attention=True))
    assert torch.equal(a.metrics["mu"], b.metrics["mu"])
    upper = ~torch.from_numpy(TRIL)
    assert [bool((att[..., upper] == 0).all()) for att in a.attention] == [True, False, True, False]


def test_a_bad_form_is_a_mask_error_before_any_layer():
    from rankcollapse.errors import MaskError

    with pytest.raises(MaskError, match="boolean"):
        simulate(_X(), mask=TRIL.astype(float), run=RunConfig(depth=1))
    with pytest.raises(MaskError, match=r"shape \(6, 6\) for N=6 tokens, got \(5, 5\)"):
        simulate(_X(), mask=Mask.from_dense(TRIL[:5, :5]), run=RunConfig(depth=1))
