"""Weight families and input helpers: defining properties, seeding, sharing."""

import math

import pytest
import torch

from rankcollapse.dynamics import hemisphere_tokens, sphere_tokens
from rankcollapse.dynamics.weights import draw, generator, random_layers
from rankcollapse.errors import ConfigError

D = 24


def g(role="W_V", layer=0):
    return generator(7, layer, role)


def test_orthogonal_is_orthogonal_and_haar_signs():
    Q = draw("orthogonal", D, D, g())
    torch.testing.assert_close(Q.T @ Q, torch.eye(D, dtype=torch.float64))
    # Haar: the mean of the diagonal over many draws is ~0 (a plain QR without the sign
    # fix gives a positive-diagonal R and a biased Q)
    diag = torch.stack([draw("orthogonal", 3, 3, g(layer=t)).diagonal() for t in range(400)])
    assert float(diag.mean().abs()) < 0.06


def test_spd_symmetric_with_eigenvalues_in_range():
    S = draw("spd:lo=0.2,hi=0.7", D, D, g())
    torch.testing.assert_close(S, S.T)
    ev = torch.linalg.eigvalsh(S)
    assert float(ev.min()) >= 0.2 - 1e-12 and float(ev.max()) <= 0.7 + 1e-12


def test_gaussian_bert_xavier_nonnegative_statistics():
    assert float(draw("gaussian", 400, 400, g()).std()) == pytest.approx(1 / 20, rel=0.02)
    assert float(draw("bert", 400, 400, g()).std()) == pytest.approx(0.02, rel=0.02)
    a = math.sqrt(6 / (300 + 100))
    X = draw("xavier", 300, 100, g())
    assert float(X.abs().max()) <= a and float(X.abs().max()) > 0.99 * a
    assert float(draw("nonnegative", D, D, g()).min()) >= 0
    torch.testing.assert_close(draw("scaled_identity:scale=0.5", 3, 3, g()), 0.5 * torch.eye(3, dtype=torch.float64))


def test_seeded_streams_independent_of_other_roles():
    a = random_layers(D, 3, value="gaussian", seed=1)
    b = random_layers(D, 3, value="orthogonal", seed=1)
    assert torch.equal(a[2].W_Q, b[2].W_Q) and not torch.equal(a[2].W_V, b[2].W_V)
    assert not torch.equal(a[0].W_Q, a[1].W_Q)
    shared = random_layers(D, 3, shared=True)
    assert all(torch.equal(lw.W_V, shared[0].W_V) for lw in shared)


def test_user_matrices_and_errors():
    Ws = [torch.eye(4) * (t + 1) for t in range(3)]
    layers = random_layers(4, 3, value=Ws)
    assert float(layers[2].W_V[0, 0]) == 3.0
    with pytest.raises(ConfigError, match="list of 2 matrices for depth 3"):
        random_layers(4, 3, value=Ws[:2])
    with pytest.raises(ConfigError, match="square"):
        draw("orthogonal", 4, 5, g())
    with pytest.raises(ConfigError, match="unknown weight family"):
        draw("haar", 4, 4, g())
    with pytest.raises(ConfigError, match="NaN"):
        random_layers(2, 1, value=torch.tensor([[float("nan"), 0], [0, 1]]))


def test_sphere_and_hemisphere_tokens():
    S = sphere_tokens(3, 50, 5, seed=2)
    torch.testing.assert_close(S.norm(dim=-1), torch.ones(3, 50, dtype=torch.float64))
    Hm = hemisphere_tokens(3, 50, 5, seed=2)
    torch.testing.assert_close(Hm.norm(dim=-1), torch.ones(3, 50, dtype=torch.float64))
    assert bool((Hm[..., 0] >= 0).all())
    pole = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert bool((hemisphere_tokens(1, 50, 5, pole=pole) @ pole >= 0).all())


def test_random_layers_do_not_depend_on_the_thread_count():
    """Layers are drawn on up to get_num_threads() threads; every matrix has its own
    generator, so the weights are bit-identical to a one-thread draw."""
    def draw_all(threads):
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            layers = random_layers(16, 5, query_key="gaussian:std=0.3", out_proj=True, mlp_ratio=2, seed=7)
        finally:
            torch.set_num_threads(old)
        return [m for lw in layers for m in (lw.W_Q, lw.W_K, lw.W_V, lw.W_O, lw.W_1, lw.W_2)]

    one, many = draw_all(1), draw_all(4)
    assert all(torch.equal(a, b) for a, b in zip(one, many))
    # and each matrix is its own generator's draw, scaled: W_V of layer 2
    expected = torch.randn(16, 16, generator=generator(7, 2, "W_V"), dtype=torch.float64) / math.sqrt(16)
    assert torch.equal(one[2 * 6 + 2], expected)


@pytest.mark.parametrize("spec, parsed", [
    ("gaussian:std=0.125", ("gaussian", {"std": 0.125})),
    ("orthogonal:scale=2", ("orthogonal", {"scale": 2.0})),
    ("near_identity:scale=0.5,noise=0.2", ("near_identity", {"scale": 0.5, "noise": 0.2})),
    ("constructed:scale=1,rank=3", ("constructed", {"scale": 1.0, "rank": 3.0})),
    ("spd:lo=0.5,hi=2", ("spd", {"lo": 0.5, "hi": 2.0})),
    (" xavier : gain = 2 ", ("xavier", {"gain": 2.0})),
    ("identity", ("identity", {})),
])
def test_documented_family_spellings_read_to_their_parameters(spec, parsed):
    from rankcollapse.dynamics.weights import parse_family

    assert parse_family(spec) == parsed


def test_family_keyword_parameters_are_read_as_the_specs():
    assert torch.equal(draw("gaussian:std=0.5", 3, 3, g()), draw("gaussian", 3, 3, g(), std=0.5))
    with pytest.raises(ConfigError, match="'gaussian' has no key 'scale'; it takes parameters std"):
        draw("gaussian", 3, 3, g(), scale=0.5)
    with pytest.raises(ConfigError, match="key 'std' must be a finite number"):
        draw("gaussian:std=inf", 3, 3, g())


@pytest.mark.parametrize("spec", ["nonnegative:std=-1", "gaussian:std=-0.5", "near_identity:noise=-0.1", "xavier:gain=-2"])
def test_a_negative_spread_is_refused(spec):
    """``nonnegative:std=-1`` would draw non-positive entries; a spread is >= 0 (a scale
    keeps its sign: ``orthogonal:scale=-1`` is ``-Q``)."""
    key = spec.split(":")[1].split("=")[0]
    with pytest.raises(ConfigError, match=f"{key} is a spread and must be >= 0"):
        draw(spec, 3, 3, g())
    assert torch.equal(draw("orthogonal:scale=-1", 3, 3, g()), -draw("orthogonal", 3, 3, g()))
