"""The temperature claims' sequence-length axis (``n_tokens_axis``, :mod:`rankcollapse.
experiments.axis`): which units it adds, the claims ``<id>.N<N>`` it decides, that each
reads the rows of its own setting only (so the claim's own verdict and rows are those of
a run without the axis), and its controls per N."""

import copy

import numpy as np
import pandas as pd
import pytest

from rankcollapse.errors import ConfigError, MemoryLimitError
from rankcollapse.experiments import runner
from rankcollapse.experiments.axis import axis_claims, axis_label, axis_units
from rankcollapse.experiments.claims import expand_checks
from rankcollapse.experiments.config import expand_units, load_config
from rankcollapse.experiments.controls import control_rule
from rankcollapse.experiments.schema import validate_config
from rankcollapse.experiments.table import normalise

CFG = load_config("fig3")
AXIS = {"positions": "none", "depth": 1, "backend": "blocked", "metrics": ["mu", "mu_relative"], "chunk": 1}


def _plan(scale):
    return runner.plan("fig3", scale, 0)[1]


def test_axis_units_per_n():
    units = _plan("quick")
    default = [u for u in units if u.params["setting"] == "default"]
    # the config's own units are those of a run without the axis (same parameters, same keys)
    data = default[0].params["data"]
    assert [u.hash for u in default] == [u.hash for u in expand_units(CFG, "quick", 0, data=data)]
    axis = [u for u in units if u.params["setting"] != "default"]
    by_n = {}
    for u in axis:
        by_n.setdefault(u.params["n_tokens"], []).append(u)
        assert u.params["setting"] == f"n_tokens={u.params['n_tokens']},positions=none"
        assert {k: u.params[k] for k in AXIS} == AXIS
        assert u.params["n_samples"] == (4 if u.params["n_tokens"] == 8192 else 8)
    assert sorted(by_n) == [128, 1024, 8192]
    for n, us in by_n.items():
        # 3 masks x d_qk {1/64, 1, 64} and the two d_qk = 1e8 control units; no d_qk = 32
        assert len(us) == 11
        assert sorted({u.params["d_qk"] for u in us}) == [0.015625, 1.0, 64.0, 1e8]
        assert sum(u.params.get("role") == "control" for u in us) == 2


def test_smoke_caps_the_axis_and_windows_are_capped():
    assert sorted({u.params.get("n_tokens") for u in _plan("smoke") if u.params["setting"] != "default"}) == [128, 1024]
    assert [c["id"] for c in axis_claims(CFG, "smoke")] == ["C06.N128", "C06.N1024", "C07.N128", "C07.N1024"]
    big = axis_units(CFG, expand_units(CFG, "paper", 0, data={"corpus": "wikipedia", "n_tokens": 128, "seed": 0}), "paper")
    # max_windows {1024: 256, 8192: 4}; control units keep their 16 where that is fewer
    windows = {(u.params["n_tokens"], u.params.get("role") == "control", u.params["n_samples"]) for u in big}
    assert windows == {(128, False, 3000), (128, True, 16), (1024, False, 256), (1024, True, 16), (8192, False, 4),
                       (8192, True, 4)}


def test_axis_claims_keep_rule_and_controls():
    claims = {c["id"]: c for c in axis_claims(CFG, "quick")}
    assert sorted(claims) == sorted(f"{c}.N{n}" for c in ("C06", "C07") for n in (128, 1024, 8192))
    own = {c["id"]: c for c in CFG["claims"]}
    for cid, c in claims.items():
        base = own[cid.split(".")[0]]
        assert c["rule"] == base["rule"] and c["controls"] == base["controls"]
        assert c["setting"] == axis_label(base["n_tokens_axis"], c["axis"]["n_tokens"])
        assert "nearby" not in c and "n_tokens_axis" not in c


# ---------------------------------------------------------------- verdicts on synthetic rows
def _selections(claim):
    """Every (select, metric) the rule and both controls read."""
    rules = [claim["rule"]] + [control_rule(claim["rule"], claim["controls"][k]) for k in ("positive", "negative")]
    out = {}

    def leaves(q):
        if q.get("stat") in ("ratio", "difference"):
            return leaves(q["num"]) + leaves(q["den"])
        return [] if "const" in q else [q]

    for rule in rules:
        for check in expand_checks(rule["checks"]):
            for q in leaves(check["lhs"]) + leaves(check.get("rhs", {"const": 1})):
                out[tuple(sorted((k, str(v)) for k, v in q["select"].items()))] = (q["select"], q["metric"])
    return list(out.values())


def _rows(claim, slope, setting, depth):
    """One layer-0/1 condition per selection: mu_relative = 1 then ``slope(select)``, over
    8 windows (window j scaled by 1 + 0.01 j)."""
    frames = []
    for sel, metric in _selections(claim):
        rows = [{"layer": t, "metric": metric, "values": v, "mean": float(v.mean()), "n_samples": 8}
                for t, v in ((0, np.ones(8)), (1, slope(sel) * (1 + 0.01 * np.arange(8))))]
        labels = {**sel, "mask": str(sel["mask_spec"]).split(":")[0], "setting": setting, "depth": depth,
                  "dtype": "float64", "value": "pretrained"}
        frames.append(normalise(pd.DataFrame(rows), labels))
    return pd.concat(frames, ignore_index=True)


def c06(present):
    """d_qk < 2 keeps 0.9 of mu_rel and larger d_qk 0.5 when present, reversed when not;
    uniform attention (d_qk = 1e8) keeps 0.1 (the positive control's reference)."""
    return lambda s: 0.1 if s["d_qk"] > 1e6 else (0.9 if (s["d_qk"] < 2) == present else 0.5)


def _records(table):
    return {r["id"]: r for r in runner.evaluate_claims([CFG], table, "quick")}


def test_each_n_reads_its_own_rows():
    claim = next(c for c in CFG["claims"] if c["id"] == "C06")
    default = _rows(claim, c06(True), "default", -1)
    alone = _records(default)
    table = pd.concat([default, _rows(claim, c06(True), "n_tokens=128,positions=none", 1),
                       _rows(claim, c06(False), "n_tokens=1024,positions=none", 1)], ignore_index=True)
    rec = _records(table)
    assert [r for r in rec if r.startswith("C06")] == ["C06", "C06.N128", "C06.N1024", "C06.N8192"]
    # the claim's own record does not see the axis rows
    for key in ("verdict", "measured", "interval", "checks", "controls"):
        assert rec["C06"][key] == alone["C06"][key]
    assert rec["C06"]["verdict"] == "reproduced" and "axis" not in rec["C06"]
    assert rec["C06.N128"]["verdict"] == "reproduced" and rec["C06.N128"]["controls_ok"] is True
    assert rec["C06.N1024"]["verdict"] == "not reproduced" and rec["C06.N1024"]["controls_ok"] is True
    assert rec["C06.N8192"]["verdict"] == "not run"  # no rows of that setting
    assert rec["C06.N1024"]["setting"] == "n_tokens=1024,positions=none"
    assert rec["C06.N1024"]["axis"]["claim"] == "C06" and rec["C06.N1024"]["axis"]["n_tokens"] == 1024


def test_controls_are_read_at_the_axis_setting():
    """A control that fails at N (the uniform-attention rows keep as much μ as the
    sharpest) is flagged at that N only."""
    claim = next(c for c in CFG["claims"] if c["id"] == "C06")
    broken = lambda s: 0.9 if s["d_qk"] > 1e6 else c06(True)(s)  # noqa: E731
    table = pd.concat([_rows(claim, c06(True), "default", -1), _rows(claim, c06(True), "n_tokens=128,positions=none", 1),
                       _rows(claim, broken, "n_tokens=1024,positions=none", 1)], ignore_index=True)
    rec = _records(table)
    assert rec["C06"]["controls_ok"] is True and rec["C06.N128"]["controls_ok"] is True
    assert rec["C06.N1024"]["controls"]["positive"]["verdict"] == "not reproduced"
    assert rec["C06.N1024"]["controls_ok"] is False


def test_recheck_reads_the_axis_rules(tmp_path):
    """A finished run's axis claims recheck from its stored table and config."""
    import json

    claim = next(c for c in CFG["claims"] if c["id"] == "C06")
    table = pd.concat([_rows(claim, c06(True), "default", -1), _rows(claim, c06(False), "n_tokens=1024,positions=none", 1)],
                      ignore_index=True)
    records = runner.evaluate_claims([CFG], table, "quick")
    table.to_parquet(tmp_path / "table.parquet")
    (tmp_path / "claims.json").write_text(json.dumps(records))
    (tmp_path / "config.json").write_text(json.dumps({"configs": [CFG], "scale": "quick"}))
    got = {cid: (stored, again) for cid, stored, again in runner.recheck(tmp_path)}
    assert got["C06.N1024"] == ("not reproduced", "not reproduced") and got["C06"] == ("reproduced", "reproduced")


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("axis, match", [
    ({"n_tokens": [1]}, "distinct integers >= 2"),
    ({"n_tokens": [128, 128]}, "distinct integers >= 2"),
    ({"units": {}}, "units"),
    ({"n_tkens": [128]}, "n_tkens"),
    ({"max_windows": {1024: 0}}, "window counts must be >= 1"),
])
def test_schema_refuses_a_bad_axis(axis, match):
    cfg = copy.deepcopy(CFG)
    cfg["claims"][0]["n_tokens_axis"].update(axis)
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, "fig3")


def test_blocked_path_memory_counts_chunks_not_edges():
    """Complete attention over 8 windows x 12 heads at N = 8,192 in float64: the dense
    path needs three (B, H, N, N) arrays (19 GiB each); the windowed kernel holds one
    block's scores (B H x 64 x N) per chunk, so it fits in 4 GiB."""
    import torch

    from rankcollapse.dynamics.runner import check_attention_fits
    from rankcollapse.masks import resolve_mask

    mask = resolve_mask("complete", 8192)
    with pytest.raises(MemoryLimitError):
        check_attention_fits(mask, 8, 8192, 8, n_heads=12, backend="dense", max_memory="4GiB", block_size=64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        check_attention_fits(mask, 8, 8192, 8, n_heads=12, backend="blocked", max_memory="4GiB", block_size=64)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("params, match", [
    ({"positions": "rope"}, "positions must be one of model, none"),
    ({"depth": 7}, r"depth must be an integer in 1\.\.6"),
    ({"depth": 0}, r"depth must be an integer in 1\.\.6"),
])
def test_pretrained_sa_refuses_meaningless_parameters(params, match):
    from rankcollapse.experiments.units import run_pretrained_sa
    from rankcollapse.sweep.context import RunContext
    from rankcollapse.sweep.units import Unit

    unit = Unit("pretrained_sa", {"model": "minilm", "mask": "complete", "d_qk": 1.0, "variant": "pure",
                                  "n_samples": 1, **params}, "fig3")
    with pytest.raises(ConfigError, match=match):
        run_pretrained_sa(unit, RunContext({"corpus": "wikipedia", "n_tokens": 16, "seed": 0}))


def test_pretrained_sa_depth_runs_the_first_layers():
    """``depth: 1`` gives the first layer of the full network, bit for bit."""
    from rankcollapse.experiments.units import run_pretrained_sa
    from rankcollapse.sweep.context import RunContext
    from rankcollapse.sweep.units import Unit

    ctx = RunContext({"corpus": "wikipedia", "n_tokens": 16, "seed": 0})
    p = {"model": "minilm", "mask": "causal", "d_qk": 1.0, "variant": "pure", "n_samples": 2, "metrics": ["mu_relative"]}
    full = run_pretrained_sa(Unit("pretrained_sa", p, "fig3"), ctx)
    one = run_pretrained_sa(Unit("pretrained_sa", {**p, "depth": 1}, "fig3"), ctx)
    assert sorted(full["layer"].unique()) == list(range(7)) and sorted(one["layer"].unique()) == [0, 1]
    assert (full["depth"] == -1).all() and (one["depth"] == 1).all()
    first = full[full["layer"] <= 1].reset_index(drop=True)
    assert np.array_equal(np.stack(first["values"]), np.stack(one["values"]))
