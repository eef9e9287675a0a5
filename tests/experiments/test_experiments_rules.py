"""Every pre-registered rule can pass and can fail: for each claim, a small synthetic
table where the effect is present must give ``reproduced`` and one where it is absent
or reversed must give ``not reproduced``.

The table holds one condition per selection the rule makes: per-layer values
``a * r**t`` over 4 windows (window j scaled by 1 + 0.01 j, so intervals have width) and,
for simulated networks, 2 weight seeds, to twice the claim depth. A scenario gives
``(a, r)`` (or a scalar for theory counts) per condition.
"""

import itertools

import numpy as np
import pandas as pd
import pytest

from rankcollapse.experiments import claims as C
from rankcollapse.experiments.config import EXPERIMENTS, load_config
from rankcollapse.experiments.table import normalise

D = 32  # claim depth
LAYERS = {"simulate": 2 * D, "probe": 6, "pretrained_sa": 6, "theory": 80}
SCALARS = {"n_found", "n_found_random", "n_constructed_perturbed", "expected_min", "n_equilibria", "basin_ci_low",
           "averaging_rate", "measured_rate"}
R = 19.595917942265423


def _claims():
    """The paper's claims; the geometry claims (G1-G5: Spearman across layers, minima over
    selected layers) have their own present/absent tables in test_geometry_claims.py, the
    position-bias claims (I1-I4: exact profiles, Spearman across positions) theirs in
    test_influence_experiment.py, the temperature-law claims (L1-L5) theirs in
    test_laws_experiment.py, the power-method claims (P1-P3) theirs in test_power_experiment.py, the energy claims (E1-E2) theirs in test_energy_experiment.py, the sink claim (S1) its own in
    test_sinks_experiment.py."""
    out = {}
    for name in EXPERIMENTS:
        if name in ("geometry", "influence", "laws", "power", "energy", "sinks"):
            continue
        for c in load_config(name).get("claims", []):
            out[c["id"]] = c
    return out


CLAIMS = _claims()


def _quantities(q):
    if "const" in q or q.get("stat") == "envelope_rate":  # constants: no rows
        return []
    if q.get("stat") in ("ratio", "difference"):
        return _quantities(q["num"]) + _quantities(q["den"])
    return [q]


def _rows(sel: dict, metric: str, spec, layer) -> pd.DataFrame:
    source = sel.get("source", "simulate")
    labels = {k: v for k, v in sel.items()}
    if "mask_spec" in sel:
        labels["mask"] = str(sel["mask_spec"]).split(":")[0]
    labels["dtype"] = "float32" if source == "probe" else "float64"  # the compute dtype (units.compute_dtype)
    labels["depth"] = LAYERS["simulate"] if source == "simulate" else -1
    seeds = [0, 1] if source == "simulate" else [-1]
    rows = []
    if metric in SCALARS:
        layers, vals = [int(layer)], {int(layer): np.array([float(spec)])}
    else:
        a, r = spec
        layers = list(range(LAYERS[source] + 1))
        vals = {t: a * r ** t * (1 + 0.01 * np.arange(4)) for t in layers}
    for seed in seeds:
        for t in layers:
            v = vals[t] * (1 + 0.003 * max(seed, 0))
            rows.append({"layer": t, "metric": metric, "mean": float(v.mean()), "values": v, "seed": seed,
                         "n_samples": len(v), "point": f"layer.{t}"})
    return normalise(pd.DataFrame(rows), labels)


def table_for(claim: dict, scenario) -> pd.DataFrame:
    seen, frames = set(), []
    for check in C.expand_checks(claim["rule"]["checks"]):
        for q in _quantities(check["lhs"]) + _quantities(check.get("rhs", {"const": 1})):
            key = (tuple(sorted((k, str(v)) for k, v in q["select"].items())), q["metric"], str(q.get("layer")))
            if key in seen:
                continue
            seen.add(key)
            spec = scenario(q["select"], q["metric"], q.get("layer"))
            if spec is not None:
                frames.append(_rows(q["select"], q["metric"], spec, q.get("layer")))
    return pd.concat(frames, ignore_index=True)


def _windowed(sel):
    return str(sel.get("mask_spec", "")).startswith(("sliding", "causal_sliding"))


# Scenarios: (effect present, effect absent or reversed) per claim.
def c01(present):
    return lambda s, m, l: (1.0, 0.99) if _windowed(s) else (1.0, 0.2 if present else 0.99)


def c02(present):
    def f(s, m, l):
        if s.get("norm") in ("layernorm", "sphere") and (s.get("norm") == "layernorm" or s.get("sphere_radius") == R):
            return (1.0, 1.0 if present else 0.9)  # matched logit scale: mu_rel held, or falling 10 %/layer
        return (1.0, 0.9)  # reference rows: pure SA and the unit sphere collapse
    return f


def c11(present):
    def f(s, m, l):
        if s.get("variant") == "ln_example_basin":
            return (1.0, 1.0)  # the constructed W_V in its basin holds mu_rel
        return (1.0, 0.9 if present else 0.995)  # orthogonal W_V: falls 10 %/layer, or within the margin
    return f


def c03(present):
    def f(s, m, l):
        if s.get("variant") == "drop_norm":  # the factor off: without norms, as fast as attention only
            return (0.8, 0.1 if present else 0.5)
        if s["source"] == "pretrained_sa":
            return (0.8, 0.1 if present else 1.0)
        return (0.8, 1.0 if present else 0.5)
    return f


def c04(present):
    return lambda s, m, l: (1.0, 1.2 if present else 1.01)


def c05(present):
    def f(s, m, l):
        if s["variant"] == "skip":
            return (1.0, 1.2 if present else 1.25)
        return (1.0, 1.0 if present else 1.25)
    return f


def c06(present):
    def f(s, m, l):
        small = s["d_qk"] < 2
        return (1.0, 0.9 if small == present else 0.5)
    return f


def c07(present):
    def f(s, m, l):
        hot = s["d_qk"] > 2
        global_ = not _windowed(s)
        strong = global_ == present
        return (1.0, (0.3 if strong else 0.8) if hot else 0.9)
    return f


def c08(present):
    def f(s, m, l):
        causal = s.get("mask_spec") == "causal"
        return (1.0, 0.95 if (causal and present) else 0.5)
    return f


def c09(present):
    def f(s, m, l):
        if m == "averaging_rate":
            return 0.998
        return (1.0, 0.9 if present else 1.02) if s["source"] == "simulate" else (1.0, 0.5 if present else 1.0)
    return f


def c10(present):
    def f(s, m, l):
        if m == "basin_ci_low":
            return 0.08 if present else 0.0
        k = int(l)
        if m == "expected_min":
            return 2 ** k
        if m in ("n_equilibria", "n_found", "n_found_random"):  # reference counts: not decisive
            return 2 ** k
        return 2 ** k if present else 2 ** k - 1  # n_constructed_perturbed decides
    return f


def c12(present):
    def f(s, m, l):
        if s["source"] == "pretrained_sa":
            return (0.5, 1.0) if present else (1.0, 1.0)
        if m == "rank_fraction":
            return (0.95, 1.0) if present else (0.5, 1.0)
        return (0.2, 1.1) if present else (0.5, 0.9)  # avg |cos| rises / falls
    return f


SCENARIOS = {"C01": c01, "C02": c02, "C03": c03, "C04": c04, "C05": c05, "C06": c06, "C07": c07, "C08": c08,
             "C09": c09, "C10": c10, "C11": c11, "C12": c12}


def test_every_claim_has_scenarios():
    assert set(SCENARIOS) == set(CLAIMS) and len(CLAIMS) == 12


@pytest.mark.parametrize("cid, present", list(itertools.product(sorted(SCENARIOS), [True, False])))
def test_rule_passes_when_present_and_fails_when_absent(cid, present):
    claim = CLAIMS[cid]
    res = C.evaluate_claim(table_for(claim, SCENARIOS[cid](present)), claim, depth=D, n_boot=200)
    assert C.registered_verdict(res) == ("reproduced" if present else "not reproduced"), (cid, present, [
        (c["check"], c["outcome"], c["value"], c["interval"]) for c in res["checks"]])
    assert res["measured"] is not None and len(res["interval"]) == 2


def _window_cases():
    return [(cid, o) for cid in sorted(CLAIMS) for o in CLAIMS[cid].get("nearby", []) if set(o) == {"window"}]


@pytest.mark.parametrize("cid, override", _window_cases())
def test_window_setting_reads_the_rows_of_its_width(cid, override):
    """A nearby window setting reads the windowed rows at its width wherever the rule
    names the window mask, including masks a ``for_each`` loop fills in: the rows of the
    present scenario relabelled to width w and to the setting reproduce as by default."""
    from rankcollapse.experiments.config import setting_label

    claim, label = CLAIMS[cid], setting_label(override)
    table = table_for(claim, SCENARIOS[cid](True))
    windowed = table["mask_spec"].astype(str).str.contains("sliding_window:w=")
    assert windowed.any()
    table.loc[windowed, "mask_spec"] = table.loc[windowed, "mask_spec"].astype(str).str.replace(
        r"w=\d+", f"w={override['window']}", regex=True)
    res = C.evaluate_claim(table.assign(setting=label), claim, setting=label, override=override, depth=D, n_boot=200)
    assert C.registered_verdict(res) == "reproduced", res.get("missing")


def test_window_setting_names_the_width_it_reads():
    claim = CLAIMS["C06"]
    table = table_for(claim, SCENARIOS["C06"](True))
    windowed = table["mask_spec"].astype(str) == "sliding_window:w=9"
    table.loc[windowed, "mask_spec"] = "sliding_window:w=3"
    res = C.evaluate_claim(table.assign(setting="window=3"), claim, setting="window=3", override={"window": 3},
                           depth=D, n_boot=50)
    names = [c["check"] for c in res["checks"]]
    assert "d_qk 1/64 vs 64 [mask=sliding_window:w=3]" in names and not any("w=9" in n for n in names)
