"""End to end on real data (MiniLM on Wikipedia): slow, run by CI's slow suite."""

import json

import pytest

from rankcollapse.experiments import ExecutionConfig, runner

QUIET = ExecutionConfig(progress=False)


@pytest.mark.slow
def test_real_main_smoke_run_verdicts_recompute_and_rerun_uses_cache(tmp_path):
    out = tmp_path / "run"
    first = runner.run_experiment("main", "smoke", out, seed=0, nearby=False, execution=QUIET)
    t = first.table
    sim = t[(t["source"] == "simulate") & (t["metric"] == "mu_relative")]
    assert set(sim["mask"]) == {"complete", "causal", "sliding_window", "causal_sliding_window"}
    assert set(sim["variant"]) == {"pure", "sphere", "layernorm", "skip", "post_ln"}
    # d_qk = 1 (main also runs pure SA at d_qk = 1e4, C02's temperature-matched reference)
    pure = sim[(sim["mask"] == "complete") & (sim["variant"] == "pure") & (sim["d_qk"] == 1.0)].set_index("layer")["mean"]
    assert pure.iloc[-1] <= pure.loc[0] / 100  # >= 100x collapse on real embeddings
    assert all(stored == again for _, stored, again in runner.recheck(out))
    second = runner.run_experiment("main", "smoke", tmp_path / "run2", seed=0, nearby=False, execution=QUIET)
    assert all(u["cached"] for u in second.timings)
    assert second.table.equals(first.table)  # same seed, same numbers to the last digit
    assert second.seconds < first.seconds / 3
    assert json.loads((out / "claims.json").read_text())[0]["id"] == "C01"
