"""Config schema: a valid config passes; a typo in a key or a rule is an error naming it."""

import copy

import pytest
import yaml

from rankcollapse.errors import ConfigError
from rankcollapse.experiments.schema import validate_config

CONFIG = yaml.safe_load("""
name: demo
title: "demo"
data: {corpus: wikipedia, n_tokens: 128, embed_model: minilm}
scales:
  smoke: {n_samples: 4, n_seeds: 1, depth: 16}
  paper: {n_samples: 3000, n_seeds: 3, depth: 64}
units:
  - kind: simulate
    grid: {mask: [complete, causal], variant: [pure]}
    params: {model: minilm, d_qk: 1.0}
plots:
  - {id: p1, title: "t", metric: mu, lines: mask, loglog: true, select: {source: simulate}}
claims:
  - id: C01
    effect: "masks slow collapse"
    plot: p1
    rule:
      statement: "causal keeps more mu"
      checks:
        - name: "causal vs complete"
          lhs: {stat: change, metric: mu, layer: 16, select: {mask_spec: causal}}
          op: ">="
          factor: 2
          rhs: {stat: change, metric: mu, layer: 16, select: {mask_spec: complete}}
""")


def test_valid_config_passes_and_keeps_values():
    cfg = validate_config(CONFIG, "demo")
    check = cfg.claims[0].rule.checks[0]
    assert check.op == ">=" and check.factor == 2 and check.lhs.layer == 16
    assert check.rhs.select == {"mask_spec": "complete"}


@pytest.mark.parametrize("path,key,value,message", [
    (("claims", 0, "rule", "checks", 0), "factr", 2, "claims[0].rule.checks[0]: unknown key 'factr'"),
    (("claims", 0, "rule", "checks", 0, "lhs"), "layr", 16, "claims[0].rule.checks[0].lhs: unknown key 'layr'"),
    (("plots", 0), "loglogg", True, "plots[0]: unknown key 'loglogg'"),
    ((), "unit", [], "unknown key 'unit'"),
])
def test_typo_is_an_error_naming_the_key(path, key, value, message):
    cfg = copy.deepcopy(CONFIG)
    node = cfg
    for p in path:
        node = node[p]
    node[key] = value
    with pytest.raises(ConfigError) as err:
        validate_config(cfg, "demo")
    assert message in str(err.value) and str(err.value).startswith("config demo: ")


def test_bad_rule_values_are_errors():
    cfg = copy.deepcopy(CONFIG)
    cfg["claims"][0]["rule"]["checks"][0]["op"] = "=>"
    with pytest.raises(ConfigError, match=r"claims\[0\]\.rule\.checks\[0\]: op"):
        validate_config(cfg, "demo")
    cfg = copy.deepcopy(CONFIG)
    cfg["units"][0]["kind"] = "simulat"
    with pytest.raises(ConfigError, match=r"units\[0\]: kind"):
        validate_config(cfg, "demo")
    cfg = copy.deepcopy(CONFIG)
    del cfg["claims"][0]["rule"]["statement"]
    with pytest.raises(ConfigError, match="missing key 'statement'"):
        validate_config(cfg, "demo")


def test_experiment_names_resolve_lists_in_order_without_repeats():
    from rankcollapse.experiments.config import EXPERIMENTS, resolve_names

    assert resolve_names(None) == ["main"] and resolve_names("all") == list(EXPERIMENTS)
    assert resolve_names("fig4, fig3,fig4") == ["fig4", "fig3"]
    with pytest.raises(ConfigError, match="'fig9'"):
        resolve_names("fig3,fig9")
