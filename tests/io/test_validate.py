"""The one validation module: typed errors naming the argument, 64-bit and finite."""

import math
import re

import numpy as np
import pytest

from rankcollapse._validate import check_float, check_int
from rankcollapse.dynamics import RunConfig, simulate
from rankcollapse.errors import ConfigError, MaskError
from rankcollapse.masks import causal, parse_mask


@pytest.mark.parametrize("value, text", [
    (True, "must be an integer, got True"), (2.0, "must be an integer, got 2.0"), ("3", "must be an integer"),
    (2**63, "must fit a signed 64-bit integer"), (-(2**63) - 1, "must fit a signed 64-bit integer"),
    (0, "must be an integer >= 1, got 0"), (11, "must be an integer <= 10, got 11"),
])
def test_check_int_rejects_with_the_argument_named(value, text):
    with pytest.raises(ConfigError, match="^width " + text):
        check_int(value, "width", low=1, high=10)


def test_check_int_accepts_numpy_and_int64_extremes():
    assert check_int(np.int32(5), "k") == 5 and type(check_int(np.int64(5), "k")) is int
    assert check_int(2**63 - 1, "seed") == 2**63 - 1 and check_int(-(2**63), "x") == -(2**63)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float32("nan"), 10**400, True, "1"])
def test_check_float_rejects_nan_inf_and_non_numbers(value):
    with pytest.raises(MaskError, match="^beta must be a"):
        check_float(value, "beta", error=MaskError)


def test_check_float_bounds():
    assert check_float(np.float32(0.5), "p", low=0, high=1) == 0.5
    with pytest.raises(ConfigError, match="d_qk must be > 0"):
        check_float(0.0, "d_qk", low=0, strict_low=True)


def test_callers_raise_their_own_error_type():
    with pytest.raises(MaskError, match="n_tokens must fit a signed 64-bit integer"):
        causal(2**64)
    with pytest.raises(MaskError, match="w must fit a signed 64-bit integer"):
        parse_mask(f"causal_sliding_window:w={2**70}", 8)
    with pytest.raises(ConfigError, match="seed must fit a signed 64-bit integer"):
        simulate(np.ones((4, 2)), mask="causal", run=RunConfig(depth=1, seed=2**64))
    with pytest.raises(ConfigError, match="d_qk must be a finite number"):
        simulate(np.ones((4, 2)), mask="causal", d_qk=math.nan, run=RunConfig(depth=1))


def test_spec_splits_in_order_strips_and_writes_back():
    from rankcollapse._validate import Spec

    assert Spec.parse(" sink : b = 2 ,, c=x ", "attention") == Spec("sink", {"b": "2", "c": "x"})
    assert Spec.parse("causal", "mask") == Spec("causal", {})
    assert str(Spec.parse(" sink : b = 2 ,, c=x ", "attention")) == "sink:b=2,c=x"
    assert Spec.name_of("sliding_window:w=9") == "sliding_window" and Spec.name_of(" causal ") == "causal"


def test_spec_types_values_by_key_kind():
    from rankcollapse._validate import Key, Spec

    names = {"k": (Key("i", "int"), Key("f", default=None), Key("b", "bool", False), Key("l", "ints", ()), Key("s", "str", None))}
    got = Spec.parse("k:i=-3,f=2.5e-1,b=YES,l=3+5+8,s=smollm2", "thing", names=names)
    assert got == Spec("k", {"i": -3, "f": 0.25, "b": True, "l": (3, 5, 8), "s": "smollm2"})
    assert Spec.parse("k:i=1", "thing", names=names).params == {"i": 1}  # defaults are the caller's
    assert Spec.parse("k:i=1,f=0", "thing", names=names).params == {"i": 1, "f": 0.0}
    one = {"log": (Key("gamma"),), "llama4": ()}
    assert Spec.parse("log:2", "law", names=one, short=True) == Spec("log", {"gamma": 2.0})
    assert Spec.parse("log:gamma=2", "law", names=one, short=True) == Spec("log", {"gamma": 2.0})


@pytest.mark.parametrize("spec, text", [
    ("sink:b=2,b=3", "attention 'sink:b=2,b=3': key 'b' given twice"),
    ("sink:b", "attention 'sink:b': expected key=value, got 'b'"),
    ("sink:=2", "expected key=value, got '=2'"),
    (None, "attention must be a string NAME"),
])
def test_spec_refuses_repeated_keys_and_malformed_items(spec, text):
    from rankcollapse._validate import Spec

    with pytest.raises(ConfigError, match=re.escape(text)):
        Spec.parse(spec, "attention")


@pytest.mark.parametrize("spec, text", [
    ("relu", "unknown thing 'relu'; choose one of k, none"),
    ("k:x=1", "thing 'k:x=1': 'k' has no key 'x'; it takes parameters i, f"),
    ("none:x=1", "thing 'none:x=1': 'none' has no key 'x'; it takes no parameters"),
    ("k:i=1.5", "thing 'k:i=1.5': key 'i' must be an integer, got '1.5'"),
    ("k:i=1,f=inf", "key 'f' must be a finite number, got 'inf'"),
    ("k:f=1", "thing 'k:f=1': 'k' needs key 'i'"),
    ("none:2", "expected key=value, got '2'"),  # no short form without short=True
])
def test_spec_refuses_unknown_names_keys_and_values_naming_them(spec, text):
    from rankcollapse._validate import Key, Spec

    with pytest.raises(ConfigError, match=re.escape(text)):
        Spec.parse(spec, "thing", names={"k": (Key("i", "int"), Key("f", default=None)), "none": ()})


@pytest.mark.parametrize("parse, spec, error", [
    ("rankcollapse.dynamics.operators:parse_attention", "sink:b=2,b=3", ConfigError),
    ("rankcollapse.dynamics.operators:parse_attention", "sigmoid:bias=1, bias=1", ConfigError),
    ("rankcollapse.dynamics.weights:parse_family", "gaussian:std=1,std=2", ConfigError),
    ("rankcollapse.dynamics.temperature_laws:parse_law", "log:gamma=1,gamma=2", ConfigError),
    ("rankcollapse.dynamics.inputs:canonical_input", "simplex:rho=0.1,rho=0.2", ConfigError),
    ("rankcollapse.dynamics.inputs:make_tokens", "gaussian:std=1,std=2", ConfigError),
    ("rankcollapse.phase.grid:parse_axis", "mask=sliding_window:w=3;w=5", ConfigError),
    ("rankcollapse.phase.grid:parse_axis", "input=gaussian:std=1;std=2", ConfigError),
    ("rankcollapse.phase.grid:parse_axes", ["n_tokens=4", "n_tokens=8"], ConfigError),
    ("rankcollapse.masks.spec:check_spec", "sliding_window:w=3,w=5", MaskError),
    ("rankcollapse.masks.spec:check_spec", "causal&sliding_window:w=3,w=3", MaskError),
    ("rankcollapse.masks.schedule:parse_schedule", "schedule:sliding_window:w=3,w=5*2,complete", MaskError),
    ("rankcollapse.masks.schedule:parse_schedule", "[{mask: causal, repeat: 2, mask: complete}]", MaskError),
])
def test_every_reader_of_the_key_value_grammar_refuses_a_repeated_key(parse, spec, error):
    # the later value must not silently win ('sink:b=2,b=3' ran as b=3)
    import importlib

    module, _, name = parse.partition(":")
    fn = getattr(importlib.import_module(module), name)
    with pytest.raises(error, match="given twice"):
        fn(spec, 8) if name == "parse_schedule" else fn(spec, 1, 2, 3) if name == "make_tokens" else fn(spec)


def test_a_users_json_with_a_key_given_twice_is_refused(tmp_path):
    from rankcollapse._io import read_user_json

    (tmp_path / "s.json").write_text('{"mask": "causal", "W_V": [[1]], "nested": {"a": 1, "a": 2}}')
    with pytest.raises(ConfigError, match="gives the key 'a' twice"):
        read_user_json(tmp_path / "s.json", "system JSON", ConfigError)
    (tmp_path / "s.json").write_text('{"a": {"b": 1}, "c": {"b": 2}}')  # one key per object is fine
    assert read_user_json(tmp_path / "s.json", "system JSON", ConfigError) == {"a": {"b": 1}, "c": {"b": 2}}
