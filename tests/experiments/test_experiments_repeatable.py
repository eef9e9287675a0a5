"""What ``--seed`` promises (docs/sweeps.md, "Executors", "Repeatability"): the same
configuration run twice in one process, each time computed afresh into its own cache with
its own run context, gives the same table bit for bit. Across machines the promise is a
tolerance (1 % relative), not bits, and is not tested here."""

import pandas as pd

from rankcollapse.experiments import runner
from rankcollapse.sweep.cache import UnitCache
from rankcollapse.sweep.context import RunContext


def test_same_config_twice_in_one_process_gives_identical_tables(tmp_path):
    _, units, data = runner.plan("main", "smoke", 0, overrides=runner.run_overrides({"depth": 8, "n_samples": 2}))
    # skip connections under the complete mask: the units whose round-off the dynamics amplify most
    chosen = [u for u in units if u.kind == "simulate" and u.params["mask"] == "complete"
              and u.params["variant"] in ("skip", "post_ln")]
    assert len(chosen) == 2
    tables = []
    for k in range(2):
        table, timings = runner.compute_units(chosen, RunContext(data, "cpu"), UnitCache(tmp_path / f"cache{k}"),
                                              progress=False)
        assert not any(t["cached"] for t in timings)
        tables.append(table)
    assert len(tables[0]) > 0 and tables[0]["value"].notna().any()
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=True)
