"""One name per concept: the three epsilons are named apart; API errors name API
arguments, not command-line flags; ``data_spec`` takes and records ``n_tokens``."""

from __future__ import annotations

import math

import pytest
import torch

from rankcollapse.errors import ConfigError
from rankcollapse.experiments import StorageConfig


def test_three_epsilons_are_named_apart():
    from rankcollapse.dynamics import RunConfig, gaussian_tokens, simulate
    from rankcollapse.masks import parse_mask
    from rankcollapse.theory import check_collapse_bound
    from rankcollapse.theory.envelope import envelope_rate, epsilon_lower_bound, epsilon_uniform, predicted_rate, \
        theorem1_terms

    # epsilon_uniform: 1 / deg_max, the default of envelope_rate (causal on 5 tokens: deg_max 5)
    assert epsilon_uniform(5) == 0.2
    assert envelope_rate("causal", n_tokens=5) == envelope_rate("causal", n_tokens=5, epsilon=0.2)
    # epsilon_bound: the a-priori bound of A1, under its own key
    rate = predicted_rate(theorem1_terms(parse_mask("causal", 5)), d_qk=4.0)
    assert rate["epsilon_bound"] == epsilon_lower_bound(d_qk=4.0, token_norm=1.0, weight_norm=1.0, max_in_degree=5)
    assert rate["epsilon_bound"] == math.exp(-1.0) / 5 and "epsilon" not in rate
    # epsilon_measured: the smallest allowed entry met, on SimResult and BoundResult
    res = simulate(gaussian_tokens(2, 5, 3, seed=0), mask="causal",
                   run=RunConfig(depth=2, record_epsilon=True, record_attention=True))
    A = torch.stack(res.attention)  # (depth, B, H, N, N)
    allowed = parse_mask("causal", 5).to_dense()
    assert torch.equal(res.epsilon_measured, A[..., allowed].flatten(1).amin(1).double())
    assert not hasattr(res, "epsilon")
    bound = check_collapse_bound("causal", n_tokens=5, d_model=3, depth=2, n_samples=2)
    assert not hasattr(bound, "epsilon")
    assert "epsilon_measured_median" in bound.to_dict() and "epsilon_median" not in bound.to_dict()


def test_api_errors_name_arguments_not_flags():
    from rankcollapse.cli._boundary import in_flags
    from rankcollapse.experiments import runner
    from rankcollapse.sweep.executors import validate_executor

    for kw in (dict(seed=-1), dict(seed=0, overrides={"n_samples": 0})):
        with pytest.raises(ConfigError) as exc:
            runner.plan("main", "smoke", **kw)
        assert "--" not in str(exc.value)
    for kw in (dict(workers=0), dict(workers=2), dict(address="auto")):
        with pytest.raises(ConfigError) as exc:
            validate_executor("processes" if "workers" in kw and kw["workers"] == 0 else "serial", **kw)
        assert "--" not in str(exc.value) and str(exc.value).startswith(f"{next(iter(kw))} ")
        assert in_flags(exc.value).startswith(f"--{next(iter(kw))} ")  # the command line's wording
    with pytest.raises(ConfigError) as exc:
        runner.run_experiment("main", "smoke", seed=0, n_tokens=1, storage=StorageConfig(write=False))
    assert str(exc.value).startswith("n_tokens must be")


def test_one_unit_class_per_name():
    from rankcollapse.experiments import config, schema

    assert not hasattr(schema, "Unit") and schema.UnitSpec.__doc__ and config.Unit.__doc__


def test_data_spec_takes_n_tokens_and_names_it():
    from rankcollapse.sweep import data_spec

    assert data_spec(None, n_tokens=16, seed=0) == {"corpus": "wikipedia", "n_tokens": 16, "seed": 0}
    with pytest.raises(TypeError):
        data_spec(None, length=16, seed=0)


def test_an_error_carries_its_argument_and_the_cli_shows_the_flag():
    import pickle

    from rankcollapse.cli._boundary import FLAGS, in_flags
    from rankcollapse.dynamics import RunConfig

    with pytest.raises(ConfigError) as exc:
        RunConfig(depth=1, backend="sparse")
    err = exc.value
    assert err.argument == "backend" and str(err) == f"backend {err.detail}"
    assert err.detail.startswith("must be one of") and in_flags(err) == f"--backend {err.detail}"
    back = pickle.loads(pickle.dumps(err))  # as a worker process sends it
    assert type(back) is ConfigError and (back.argument, str(back)) == (err.argument, str(err))
    assert in_flags(ConfigError("plain")) == "plain" and set(FLAGS.values()) >= {"--n-tokens", "--max-memory"}
