"""System files with spec-string masks; CLI text output names B, the basin's system and
loose envelopes."""

import json

import pytest
import torch

from rankcollapse.errors import ConfigError, MaskError
from rankcollapse.theory.system import AttentionSystem
from tests.cli._harness import run_cli

W = {"W_Q": [[0.0], [0.0]], "W_K": [[0.0], [0.0]], "W_V": [[1.0, -3.0], [0.0, 2.0]]}


def run(*args):
    return run_cli("theory", *args)


def test_spec_string_mask_equals_boolean_list():
    by_spec = AttentionSystem.from_dict({"mask": "causal", **W})
    by_list = AttentionSystem.from_dict({"mask": [[True, False], [True, True]], **W})
    assert torch.equal(by_spec.mask, by_list.mask)
    three = AttentionSystem.from_dict({"mask": "causal_sliding_window:w=2", "n_tokens": 3, **W})
    assert three.mask.tolist() == [[True, False, False], [True, True, False], [False, True, True]]


def test_bad_system_files_raise_clear_errors():
    with pytest.raises(MaskError):
        AttentionSystem.from_dict({"mask": "no_such_mask", **W})
    with pytest.raises(ConfigError, match="n_tokens"):
        AttentionSystem.from_dict({"mask": "causal", "n_tokens": 0, **W})
    with pytest.raises(ConfigError, match="JSON object"):
        AttentionSystem.from_dict([1, 2])


def test_find_and_basin_accept_spec_masks_and_name_the_system(tmp_path):
    path = tmp_path / "sys.json"
    path.write_text(json.dumps({"mask": "causal", **W}), encoding="utf-8")
    p = run("find", "--system", str(path), "--starts", "8")
    assert p.returncode == 0, p.stderr
    p = run("basin", "--system", str(path), "--n-samples", "50", "--depth", "100")
    assert p.returncode == 0 and f"system {path}: N=2, d=2, W_V=[[1.0, -3.0], [0.0, 2.0]]" in p.stdout, p.stdout
    p = run("basin", "--n-samples", "50", "--depth", "100", "--format", "json")
    obj = json.loads(p.stdout)
    assert obj["system"]["W_V"] == W["W_V"] and "example" in obj["system"]["source"]


def test_equilibria_example_text_shows_B_and_all_ten():
    p = run("equilibria", "--example")
    assert p.returncode == 0, p.stderr
    assert "10 equilibria" in p.stdout and "(0.35505, -0.93485)" in p.stdout
    assert "X = (+0.00000, +1.00000); (+0.35505, -0.93485)" in p.stdout


def test_bound_says_when_envelope_is_uninformative():
    loose = run("bound", "--mask", "causal_sliding_window:w=2", "--n-tokens", "8", "--depth", "10", "--n-samples", "2")
    assert loose.returncode == 0 and "too loose to be informative" in loose.stdout, loose.stdout
    tight = run("bound", "--mask", "causal_sliding_window:w=8", "--n-tokens", "8", "--depth", "10", "--n-samples", "2")
    assert tight.returncode == 0 and "too loose" not in tight.stdout, tight.stdout
