"""Mask schedules: parsing, the composed graph against an independent path composition
(numpy boolean products + networkx), describe and compare."""

import json

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rankcollapse.dynamics import RunConfig
from rankcollapse.errors import MaskError
from rankcollapse.masks import analyze, parse_mask
from rankcollapse.masks.schedule import MaskSchedule, is_schedule, parse_schedule
from rankcollapse.theory.rates import compare_schedules, describe_schedule


def test_repeat_and_period():
    s = parse_schedule("schedule:sliding_window:w=9*5,complete", 32)
    assert s.period == 6
    assert [m.spec for m in s.masks[:5]] == ["sliding_window:w=9"] * 5
    assert s.layer(5).spec == "complete" and s.layer(6).spec == "sliding_window:w=9" and s.layer(11).spec == "complete"
    assert s.spec == "schedule:sliding_window:w=9*5,complete"
    assert s.edges_per_layer() == [32 * 9 - 2 * (4 + 3 + 2 + 1)] * 5 + [32 * 32]


def test_key_value_items_continue_the_previous_mask():
    s = parse_schedule("schedule:random:p=0.2,seed=3*2,block:size=4,causal=true", 16)
    assert s.period == 3
    assert s.masks[0].to_csr().nnz == parse_mask("random:p=0.2,seed=3", 16).to_csr().nnz
    assert s.masks[2].spec == parse_mask("block:size=4,causal=true", 16).spec


def test_yaml_json_and_list_forms_agree(tmp_path):
    want = parse_schedule("schedule:causal_sliding_window:w=3*2,causal", 16)
    f = tmp_path / "s.yaml"
    f.write_text("- causal_sliding_window:w=3*2\n- causal\n")
    for src in ('["causal_sliding_window:w=3*2", "causal"]', ["causal_sliding_window:w=3*2", "causal"],
                [{"mask": "causal_sliding_window:w=3", "repeat": 2}, "causal"], f"schedule:{f}"):
        got = parse_schedule(src, 16)
        assert [m.spec for m in got.masks] == [m.spec for m in want.masks]


def test_is_schedule_does_not_take_a_bool_matrix():
    assert not is_schedule([[True, False], [True, True]]) and not is_schedule("causal")
    assert is_schedule("schedule:causal") and is_schedule(["causal"])


@pytest.mark.parametrize("bad, msg", [("schedule:", "empty"), ("schedule:causal*0", "repeat"),
                                      ("schedule:causal,nosuch", "nosuch"), ("[1, 2", "YAML"),
                                      ([{"repeat": 2}], "'mask'")])
def test_bad_schedules_raise_mask_error(bad, msg):
    with pytest.raises(MaskError, match=msg):
        parse_schedule(bad, 8)


def test_composed_graph_hand_built():
    # two layers of a causal window of width 2: paths of length <= 2 backwards
    s = parse_schedule("schedule:causal_sliding_window:w=2*2", 6)
    assert np.array_equal(s.composed().to_dense().numpy(), parse_mask("causal_sliding_window:w=3", 6).to_dense().numpy())
    # window then causal = causal; centers {0}, radius 1
    a = analyze(parse_schedule("schedule:causal_sliding_window:w=3,causal", 8).composed())
    assert a.centers == [0] and a.radius == 1


_ATOMS = st.sampled_from(["causal", "complete", "causal_sliding_window:w=2", "causal_sliding_window:w=3",
                          "sliding_window:w=3", "block:size=2", "block:size=3,causal=true", "prefix:k=2"])
_RANDOM = st.builds(lambda p, s: f"random:p={p},seed={s}", st.sampled_from([0.05, 0.15, 0.3]),
                    st.integers(0, 50))


def _reference(masks: list[np.ndarray]):
    """Path composition with numpy boolean products, graph facts with networkx."""
    H = masks[0].copy()
    for M in masks[1:]:
        H = (M.astype(np.int64) @ H.astype(np.int64)) > 0
    g = nx.DiGraph()
    g.add_nodes_from(range(H.shape[0]))
    g.add_edges_from((int(j), int(i)) for i, j in zip(*np.nonzero(H)))  # i attends j: edge j -> i
    n = H.shape[0]
    lengths = {c: nx.single_source_shortest_path_length(g, c) for c in g}
    centers = sorted(c for c, d in lengths.items() if len(d) == n)
    radius = min(max(lengths[c].values()) for c in centers) if centers else None
    return H, centers, radius


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 12), items=st.lists(st.one_of(_ATOMS, _RANDOM), min_size=1, max_size=4),
       reps=st.lists(st.integers(1, 3), min_size=4, max_size=4))
def test_composed_graph_matches_independent_path_composition(n, items, reps):
    spec = "schedule:" + ",".join(f"{it}*{k}" for it, k in zip(items, reps))
    try:
        s = parse_schedule(spec, n)
    except MaskError:  # a constructor rejects its size (e.g. prefix:k=2 at N=2): nothing to compare
        return
    dense = [m.to_dense().numpy() for m in s.masks]
    H, centers, radius = _reference(dense)
    assert np.array_equal(s.composed().to_dense().numpy(), H)
    d = describe_schedule(s)
    assert d["centers"] == centers and d["radius"] == radius
    assert d["quasi_strongly_connected"] == bool(centers)
    assert d["period"] == sum(reps[: len(items)]) and len(d["layers"]) == d["period"]
    # self-loops make composition monotone: H contains every layer's mask
    assert all((H | M).sum() == H.sum() for M in dense)
    # scrambling length against its definition read literally (no monotonicity assumed)
    want = _reference_scrambling(dense, 2 * len(dense) * n) if centers else None
    assert d["scrambling_length"] == want
    if want is not None:
        assert d["effective_radius"] == min(want, d["period"] * radius)


def _reference_scrambling(masks: list[np.ndarray], cap: int):
    """Least L with every window of L layers, at every phase, composing to a graph with a
    token that reaches every token (a column of nonzeros)."""
    p, n = len(masks), masks[0].shape[0]
    for L in range(1, cap + 1):
        ok = True
        for s in range(p):
            P = np.eye(n, dtype=np.int64)
            for t in range(s, s + L):
                P = (masks[t % p].astype(np.int64) @ P > 0).astype(np.int64)
            ok = ok and bool((P > 0).all(axis=0).any())
        if ok:
            return L
    return None


def test_composed_graph_of_dense_layers_does_not_overflow():
    # 256 paths through each pair: an 8-bit path count wraps to 0 and drops the edge
    s = parse_schedule("schedule:complete*2", 256)
    assert s.composed().to_csr().nnz == 256 * 256


def test_describe_reports_rate_and_layers():
    d = describe_schedule("schedule:causal_sliding_window:w=3*2,causal", 16)
    assert d["period"] == 3 and d["n_tokens"] == 16 and d["centers"] == [0] and d["radius"] == 1
    assert [x["spec"] for x in d["layers"]] == ["causal_sliding_window:w=3"] * 2 + ["causal"]
    assert d["edges_per_layer"] == [45, 45, 136]
    # eps = e^-2 / 16 (largest in-degree 16); factor (1 - eps^3)^(1/3)
    eps = np.exp(-2.0) / 16
    assert d["epsilon_bound"] == pytest.approx(eps)
    assert d["log10_rate_per_layer"] == pytest.approx(np.log10(1 - eps**3) / 3, rel=1e-9)


def test_non_qsc_schedule_has_no_rate():
    d = describe_schedule("schedule:block:size=4*2", 8)
    assert not d["quasi_strongly_connected"] and d["radius"] is None and d["log10_rate_per_layer"] is None


def test_period_one_schedule_equals_the_mask():
    a = analyze(parse_mask("causal_sliding_window:w=4", 20))
    d = describe_schedule("schedule:causal_sliding_window:w=4", 20)
    assert d["period"] == 1 and d["centers"] == a.centers and d["radius"] == a.radius and d["n_edges"] == a.n_edges


def test_compare_ranks_at_equal_budget():
    # ranks follow the predicted per-layer rate, (1 - eps^e)^(1/e), e = min(p r_H, L)
    df = compare_schedules(["schedule:causal_sliding_window:w=2*3,causal", "causal_sliding_window:w=2"], 32)
    assert list(df["period"]) == [4, 1]
    assert list(df["radius"]) == [1, 31]
    # the interleaved schedule has effective radius min(4*1, L = 4) < 31: faster predicted collapse -> rank 2
    assert list(df["effective_radius"]) == [4, 31] and list(df["scrambling_length"]) == [4, 31]
    assert list(df["rank_predicted"]) == [2, 1]
    assert df["mean_edges_per_layer"].iloc[1] == 63


def test_measured_rank_uses_simulation():
    df = compare_schedules(["schedule:causal_sliding_window:w=2*3,causal", "causal_sliding_window:w=2"], 16,
                           measure=RunConfig(depth=30), n_samples=4)
    assert df["measured_rate"].between(0, 1).all()
    # a local chain of width 2 collapses more slowly than one that reaches everyone every 4 layers
    assert df["measured_rate"].iloc[1] > df["measured_rate"].iloc[0]
    assert list(df["rank_measured"]) == [2, 1]


def _cli(*args):
    from tests.cli._harness import run_cli

    return run_cli("mask", *args)


def test_cli_describe_schedule_interface(tmp_path):
    p = _cli("describe", "schedule:causal_sliding_window:w=3*2,causal", "--n-tokens", "16", "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert {"n_tokens", "centers", "radius", "quasi_strongly_connected", "period", "layers"} <= set(d)
    assert d["n_tokens"] == 16 and d["period"] == 3 and len(d["layers"]) == 3
    p = _cli("show", "schedule:causal_sliding_window:w=3*2,causal", "--n-tokens", "16", "--out", str(tmp_path / "s"))
    assert p.returncode == 0 and (tmp_path / "s" / "mask.png").stat().st_size > 0
    p = _cli("compare", "schedule:causal_sliding_window:w=3*2,causal", "causal", "--n-tokens", "16", "--format", "json")
    rows = json.loads(p.stdout)
    # same eps (largest in-degree 16 in both); effective radius p r = 3 vs 1: the schedule is slower
    assert [r["period"] for r in rows] == [3, 1] and [r["rank_predicted"] for r in rows] == [1, 2]
    p = _cli("describe", "schedule:causal*x", "--n-tokens", "8")
    assert p.returncode == 2 and p.stderr.count("\n") == 1


@pytest.mark.parametrize("spec", ["schedule:sliding_window:w=9*5,complete", '["causal", "complete"]'])
def test_parse_mask_routes_a_schedule_to_parse_schedule(spec):
    """parse_mask builds one mask; a schedule spec is refused with a message that names
    parse_schedule (not "unknown mask 'schedule'"), and parse_schedule builds it."""
    from rankcollapse.errors import MaskError
    from rankcollapse.masks import dense_mask, parse_mask

    for one_mask in (parse_mask, dense_mask):
        with pytest.raises(MaskError, match=r"mask schedule \(one mask per layer\).*parse_schedule\(spec, n_tokens\)"):
            one_mask(spec, 16)
    assert parse_schedule(spec, 16).period in (2, 6)


def test_parse_schedule_is_the_one_entry_point_for_masks_and_schedules():
    """A single mask spec through parse_schedule is a period-1 schedule of that mask."""
    from rankcollapse.masks import parse_mask

    s = parse_schedule("causal_sliding_window:w=3", 10)
    assert s.period == 1 and bool((s.layer(7).to_dense() == parse_mask("causal_sliding_window:w=3", 10).to_dense()).all())


def test_compare_takes_the_exponent_variant():
    # t/(2r) halves the log of the per-layer factor; an unknown exponent is refused
    from rankcollapse.errors import ConfigError

    a = compare_schedules(["schedule:complete*3"], 8)
    b = compare_schedules(["schedule:complete*3"], 8, exponent="t/(2r)")
    assert b.loc[0, "log10_rate_per_layer"] == pytest.approx(a.loc[0, "log10_rate_per_layer"] / 2, rel=1e-14)
    with pytest.raises(ConfigError, match="exponent"):
        compare_schedules(["schedule:complete*3"], 8, exponent="t^2")
    p = _cli("compare", "schedule:complete*3", "--n-tokens", "8", "--exponent", "t^2")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
