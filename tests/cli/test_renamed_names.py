"""One name per concept (issue 28): every renamed argument or attribute still works under
its old name until 0.3.0, with a FutureWarning naming the new name and the removal
version; API errors name API arguments, not command-line flags."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from rankcollapse._deprecation import REMOVAL, renamed_arguments
from rankcollapse.errors import ConfigError


def _same_with_warning(old_call, new_call, old_name, new_name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = new_call()  # the canonical name: no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = old_call()
    texts = [str(w.message) for w in caught]
    assert caught and all(w.category is FutureWarning and "will be removed in 0.3.0" in t for w, t in zip(caught, texts))
    assert any(old_name in t and f"use {new_name}" in t for t in texts), texts
    return old, new


def test_removal_version_and_both_names_refused():
    assert REMOVAL == "0.3.0"

    @renamed_arguments(n="n_tokens")
    def f(*, n_tokens: int = 1) -> int:
        return n_tokens

    assert f(n_tokens=3) == 3
    with pytest.warns(FutureWarning, match=r"f\(n=\.\.\.\) is deprecated"):
        assert f(n=4) == 4
    with pytest.raises(ConfigError, match="not both"):
        f(n=1, n_tokens=2)


def test_theory_arguments_n_and_d_renamed():
    from rankcollapse.theory import check_collapse_bound, equilibria
    from rankcollapse.theory.envelope import envelope_crossing_depth, envelope_rate, scrambling_length

    old, new = _same_with_warning(lambda: envelope_rate("causal_sliding_window:w=2", n=6),
                                  lambda: envelope_rate("causal_sliding_window:w=2", n_tokens=6), "n=", "n_tokens=")
    assert old == new
    old, new = _same_with_warning(lambda: envelope_crossing_depth("complete", 0.01, n=4),
                                  lambda: envelope_crossing_depth("complete", 0.01, n_tokens=4), "n=", "n_tokens=")
    assert old == new
    assert scrambling_length("causal", n_tokens=5) == 1
    kw = dict(depth=3, n_samples=2, seed=0)
    old, new = _same_with_warning(lambda: check_collapse_bound("causal", n=5, d=3, **kw),
                                  lambda: check_collapse_bound("causal", n_tokens=5, d_model=3, **kw), "n=", "n_tokens=")
    assert torch.equal(old.mu, new.mu) and new.config["n_tokens"] == 5 and new.config["d_model"] == 3
    old, new = _same_with_warning(lambda: equilibria(n=3, d=3, rank=2, stability=False),
                                  lambda: equilibria(n_tokens=3, d_model=3, rank=2, stability=False), "n=", "n_tokens=")
    assert len(new.equilibria) == len(old.equilibria) >= 4


def test_three_epsilons_are_named_apart():
    from rankcollapse.dynamics import gaussian_tokens, simulate
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
    # epsilon_measured: the smallest allowed entry met, on SimResult and BoundResult (old name warns)
    res = simulate(gaussian_tokens(2, 5, 3, seed=0), mask="causal", depth=2, record_epsilon=True,
                   record_attention=True)
    A = torch.stack(res.attention)  # (depth, B, H, N, N)
    allowed = parse_mask("causal", 5).to_dense()
    assert torch.equal(res.epsilon_measured, A[..., allowed].flatten(1).amin(1).double())
    with pytest.warns(FutureWarning, match=r"SimResult\.epsilon is deprecated.*0\.3\.0; use \.epsilon_measured"):
        assert res.epsilon is res.epsilon_measured
    bound = check_collapse_bound("causal", n_tokens=5, d_model=3, depth=2, n_samples=2)
    with pytest.warns(FutureWarning, match=r"BoundResult\.epsilon is deprecated"):
        assert bound.epsilon is bound.epsilon_measured
    assert "epsilon_measured_median" in bound.to_dict() and "epsilon_median" not in bound.to_dict()


def test_windows_n_tokens_and_make_windows_alias():
    from transformers import AutoTokenizer

    from rankcollapse import assets, data

    bert_tokenizer = AutoTokenizer.from_pretrained(assets.minilm_dir())

    texts = ["the river flows " * 40] * 3
    old, new = _same_with_warning(lambda: data.make_windows(texts, bert_tokenizer, length=16, n_samples=2),
                                  lambda: data.make_windows(texts, bert_tokenizer, n_tokens=16, n_samples=2),
                                  "length=", "n_tokens=")
    assert torch.equal(old.input_ids, new.input_ids) and new.n_tokens == 16
    with pytest.warns(FutureWarning, match=r"Windows\.length is deprecated"):
        assert new.length == 16


def test_api_errors_name_arguments_not_flags():
    from rankcollapse.experiments import runner
    from rankcollapse.sweep.executors import validate_executor as check_executor

    for kw in (dict(seed=-1), dict(seed=0, overrides={"n_samples": 0})):
        with pytest.raises(ConfigError) as exc:
            runner.plan("main", "smoke", **kw)
        assert "--" not in str(exc.value)
    for kw in (dict(workers=0), dict(workers=2), dict(address="auto")):
        with pytest.raises(ConfigError) as exc:
            check_executor("processes" if "workers" in kw and kw["workers"] == 0 else "serial", **kw)
        assert "--" not in str(exc.value)
        with pytest.raises(ConfigError, match="--"):  # the command line's own wording
            check_executor("processes" if "workers" in kw and kw["workers"] == 0 else "serial", **kw, flags=True)
    with pytest.raises(ConfigError) as exc:
        runner.run_experiment("main", "smoke", seed=0, n_tokens=1, write=False)
    assert str(exc.value).startswith("n_tokens must be")


def test_one_unit_class_per_name():
    from rankcollapse.experiments import config, schema

    assert not hasattr(schema, "Unit") and schema.UnitSpec.__doc__ and config.Unit.__doc__


def test_check_executor_is_a_deprecated_alias_of_validate_executor():
    """A validator is ``validate_*``; ``check_*`` in the public API names a theorem check."""
    import rankcollapse.sweep as sweep

    with pytest.warns(FutureWarning, match=r"check_executor is deprecated and will be removed in 0\.3\.0; use validate_executor"):
        sweep.check_executor("serial")
    messages = []
    for validate in (sweep.validate_executor, sweep.check_executor):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with pytest.raises(ConfigError, match="workers") as exc:
                validate("serial", workers=2)
        messages.append(str(exc.value))
    assert messages[0] == messages[1]


def test_data_spec_takes_n_tokens_and_names_it():
    from rankcollapse.sweep import data_spec

    old, new = _same_with_warning(lambda: data_spec(None, length=16, seed=0), lambda: data_spec(None, n_tokens=16, seed=0),
                                  "length=", "n_tokens=")
    assert old == new == {"corpus": "wikipedia", "n_tokens": 16, "seed": 0}
