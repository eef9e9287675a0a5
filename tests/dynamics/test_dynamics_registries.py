"""The input registry (dynamics.inputs) and the weight-family registry (dynamics.weights):
every name draws what its formula says, the phase and the
Theorem-2 check look their inputs and families up there."""

import importlib
import math
import warnings

import numpy as np
import pytest
import torch

from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.dynamics.inputs import INPUTS, ON_SPHERE, canonical_input, make_tokens
from rankcollapse.dynamics.weights import FAMILIES, FAMILY_PARAMS, construction_eigenvalues, draw, generator
from rankcollapse.errors import ConfigError


def unit(X):
    return X / torch.linalg.vector_norm(X, dim=-1, keepdim=True)


def test_registry_names():
    assert set(INPUTS) == {"gaussian", "sphere", "hemisphere", "nonnegative", "antipodal", "simplex", "wikipedia"}
    assert set(ON_SPHERE) < set(INPUTS)
    for old in ("wiki", "minilm"):
        with pytest.raises(ConfigError, match=f"unknown input '{old}'"):
            canonical_input(old)
    with pytest.raises(ConfigError, match="unknown input 'uniform'.*gaussian, sphere"):
        make_tokens("uniform", 2, 3, 4)
    with pytest.raises(ConfigError, match="takes the options"):
        make_tokens("sphere", 2, 3, 4, std=2.0)
    with pytest.raises(ConfigError, match="needs the width"):
        make_tokens("gaussian", 2, 3, None)
    for std in ("0", "-1"):  # zero tokens have no direction; a negative std is no spread
        with pytest.raises(ConfigError, match=f"gaussian input std must be > 0, got {float(std)}"):
            make_tokens(f"gaussian:std={std}", 2, 3, 4)


@pytest.mark.parametrize("name", ["gaussian", "sphere", "hemisphere", "nonnegative", "antipodal"])
def test_every_drawn_input_is_float64_seeded_and_shaped(name):
    X = make_tokens(name, 3, 5, 4, seed=7)
    assert X.dtype == torch.float64 and X.shape == (3, 5, 4)
    assert torch.equal(X, make_tokens(name, 3, 5, 4, seed=7))
    assert not torch.equal(X, make_tokens(name, 3, 5, 4, seed=8))
    # a generator continues its stream: the same numbers as a fresh one seeded alike
    assert torch.equal(X, make_tokens(name, 3, 5, 4, generator=torch.Generator().manual_seed(7)))
    if name in ON_SPHERE:
        torch.testing.assert_close(X.norm(dim=-1), torch.ones(3, 5, dtype=torch.float64), rtol=0, atol=1e-15)


def test_formulas_against_hand_written_references():
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    G = torch.randn(2, 6, 4, generator=g(), dtype=torch.float64)
    torch.testing.assert_close(make_tokens("gaussian", 2, 6, 4, seed=3, std=0.5), 0.5 * G, rtol=0, atol=0)
    torch.testing.assert_close(make_tokens("sphere", 2, 6, 4, seed=3), unit(G), rtol=0, atol=1e-15)
    torch.testing.assert_close(make_tokens("nonnegative", 2, 6, 4, seed=3), unit(G.abs()), rtol=0, atol=1e-15)
    H = make_tokens("hemisphere", 2, 6, 4, seed=3)
    ref = unit(G) * torch.where(G[..., :1] < 0, -1.0, 1.0) * torch.tensor([1.0, -1, -1, -1]).where(
        G[..., :1] < 0, torch.ones(4))  # reflection across e_1's hyperplane flips the first coordinate only
    torch.testing.assert_close(H, ref, rtol=0, atol=1e-15)
    assert bool((H[..., 0] > 0).all())
    gen = g()
    G2 = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)
    v = unit(torch.randn(2, 1, 4, generator=gen, dtype=torch.float64))
    signs = torch.tensor([1.0, -1, 1, -1, 1, -1]).view(1, 6, 1)
    A = make_tokens("antipodal", 2, 6, 4, seed=3)
    torch.testing.assert_close(A, unit(signs * v + 1e-3 * G2), rtol=0, atol=1e-15)
    cos = torch.einsum("bnd,bmd->bnm", A, A)
    assert float(cos[:, 0, 1].max()) < -0.99 and float(torch.einsum("bnd,bmd->bnm", *(make_tokens(
        "nonnegative", 2, 6, 4),) * 2).min()) >= 0


def test_an_input_is_a_spec_with_typed_keys():
    # gaussian:std=s is the option std=s: the same numbers
    assert torch.equal(make_tokens("gaussian:std=0.5", 2, 6, 4, seed=3), make_tokens("gaussian", 2, 6, 4, seed=3, std=0.5))
    assert canonical_input(" simplex : rho = 0.25 ") == "simplex:rho=0.25" and canonical_input("sphere") == "sphere"
    X = make_tokens("simplex:rho=0.25", 2, 6, 5, seed=1)
    torch.testing.assert_close(X[..., 0], torch.full((2, 6), 0.5, dtype=torch.float64), rtol=0, atol=0)  # sqrt(rho)
    for spec, text in [("sphere:std=1", "input 'sphere:std=1': 'sphere' has no key 'std'; it takes no parameters"),
                       ("simplex:rho=x", "key 'rho' must be a finite number"),
                       ("wikipedia:block=1.5", "key 'block' must be an integer")]:
        with pytest.raises(ConfigError, match=text):
            canonical_input(spec)
    with pytest.raises(ConfigError, match="key 'std' given twice"):
        make_tokens("gaussian:std=1", 2, 3, 4, std=2.0)


def test_wikipedia_refuses_a_generator_and_too_wide_projection():
    with pytest.raises(ConfigError, match="drawn by seed"):
        make_tokens("wikipedia", 2, 8, None, generator=torch.Generator())


def test_theory_sphere_check_uses_the_registry():
    from rankcollapse.theory import sphere

    g = torch.Generator().manual_seed(0)
    X = sphere.make_inputs("hemisphere", 2, 5, 3, g)  # any input on the sphere, not only the three defaults
    assert torch.equal(X, make_tokens("hemisphere", 2, 5, 3, seed=0))
    with pytest.raises(ConfigError, match="on the unit sphere"):
        sphere.make_inputs("gaussian", 2, 5, 3, g)


def test_phase_input_axis_speaks_the_registry():
    from rankcollapse.phase.grid import parse_axis

    assert parse_axis("input=nonnegative,antipodal") == ("input", ["nonnegative", "antipodal"])
    assert parse_axis("input=simplex:rho=0.9,gaussian:std=2") == ("input", ["simplex:rho=0.9", "gaussian:std=2.0"])
    assert parse_axis("input=wikipedia:model=minilm;block=1") == ("input", ["wikipedia:model=minilm,block=1"])
    with pytest.raises(ConfigError, match="unknown input 'minilm'"):
        parse_axis("input=minilm")
    with pytest.raises(ConfigError, match="--axis input: unknown input"):
        parse_axis("input=uniform")


# ---- weight families ------------------------------------------------------------------


def test_every_family_is_in_one_registry():
    assert {"near_identity", "constructed", "pretrained"} <= set(FAMILIES)
    assert set(FAMILIES) == set(FAMILY_PARAMS)


def test_near_identity_formula():
    d = 64
    W = draw("near_identity:scale=2", d, d, generator(0, 0, "W_V"))
    noise = W - 2 * torch.eye(d, dtype=torch.float64)
    assert abs(float(noise.std()) * math.sqrt(d) - 0.1) < 0.005  # N(0, 0.1^2/d) entries
    ref = 2 * torch.eye(d, dtype=torch.float64) + torch.randn(d, d, generator=generator(0, 0, "W_V"),
                                                              dtype=torch.float64) * (0.3 / math.sqrt(d))
    torch.testing.assert_close(draw("near_identity", d, d, generator(0, 0, "W_V"), scale=2, noise=0.3), ref,
                               rtol=0, atol=0)


def test_constructed_is_the_theory_construction():
    equilibria = importlib.import_module("rankcollapse.theory.equilibria")
    lam = construction_eigenvalues(5, 3)
    np.testing.assert_allclose(lam, [0.25, 1, 4, 0.125, 0.125])  # 4^(t - 1), then lambda_0 / 2
    assert equilibria.construction_eigenvalues is construction_eigenvalues
    W = draw("constructed:rank=3,scale=2", 5, 5, torch.Generator())
    assert torch.equal(W, torch.diag(torch.as_tensor(2 * lam)))
    assert draw("constructed", 4, 4, torch.Generator(), n=3).shape == (3, 4, 4)
    with pytest.raises(ConfigError, match="integer rank in"):
        draw("constructed:rank=6", 5, 5, torch.Generator())
    with pytest.raises(ConfigError, match="square"):
        draw("near_identity", 4, 3, torch.Generator())


def test_batched_draws_follow_one_stream():
    # n matrices from one generator: what the phase sweep draws (layers one after another)
    Q = draw("orthogonal:scale=3", 4, 4, generator(1, 0, "W_V"), n=5)
    torch.testing.assert_close(Q.transpose(-1, -2) @ Q, 9 * torch.eye(4, dtype=torch.float64).expand(5, 4, 4),
                               rtol=0, atol=1e-13)
    G = draw("gaussian", 4, 4, generator(1, 0, "W_Q"), n=2, std=0.5)  # 16 entries: whole blocks of randn
    gen = generator(1, 0, "W_Q")
    ref = torch.stack([torch.randn(4, 4, generator=gen, dtype=torch.float64) * 0.5 for _ in range(2)])
    assert torch.equal(G, ref)
    with pytest.raises(ConfigError, match="takes"):
        draw("gaussian", 4, 4, gen, scale=2)


def test_simulate_runs_the_new_families():
    X0 = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    res = simulate(X0, mask="causal", value="constructed:rank=2", block="sphere", run=RunConfig(depth=3, dtype=torch.float64))
    assert res.config["value"] == "constructed:rank=2"
    res = simulate(X0, mask="causal", value="near_identity:scale=0.5", run=RunConfig(depth=3, dtype=torch.float64))
    assert torch.isfinite(res.metrics["mu"]).all()


def test_pretrained_family_is_minilms_matrix_of_the_role():
    import transformers

    from rankcollapse import assets
    from rankcollapse.dynamics.pretrained import extract_attention_weights

    path = assets.minilm_dir()  # installed by `make setup`, like every MiniLM test's

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModel.from_pretrained(path).eval()
    ref = extract_attention_weights(model)
    W = draw("pretrained:scale=2", 8, 8, torch.Generator(), n=7, role="W_V")
    for t in range(7):  # layer t mod 6
        assert torch.equal(W[t], 2 * ref[t % 6].W_V.detach().to(torch.float64)[:8, :8])
    assert torch.equal(draw("pretrained", 8, 4, torch.Generator(), layer=2, role="W_Q"),
                       ref[2].W_Q.detach().to(torch.float64)[:8, :4])
    with pytest.raises(ConfigError, match="larger"):
        draw("pretrained", 400, 400, torch.Generator())
