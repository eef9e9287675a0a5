"""Real MiniLM stored in bfloat16: the numerical rank is not lost to the storage eps."""

import torch

from rankcollapse.data import make_windows
from rankcollapse.metrics import compute_metrics
from rankcollapse.models import load_model
from rankcollapse.models.recorder import Recorder

TEXT = " ".join(["the river city was built near the old stone bridge where people trade grain wool and salt"] * 4)


def test_minilm_in_bfloat16_keeps_its_rank():
    loaded = load_model("minilm")
    w = make_windows([TEXT], loaded.tokenizer, n_tokens=32, n_samples=1)
    ranks = {}
    for dtype in (torch.float32, torch.bfloat16):
        loaded.model.to(dtype)
        with Recorder(loaded) as rec:
            loaded.model(input_ids=w.input_ids, attention_mask=w.attention_mask)
        ranks[dtype] = {k: compute_metrics(v[0], ("numerical_rank", "sigma_min")) for k, v in rec.outputs.items()}
    for point, r16 in ranks[torch.bfloat16].items():
        r32 = ranks[torch.float32][point]
        assert float(r16["numerical_rank"]) > 0, point  # was 0 at every layer
        # sigma_min is far above the bf16 noise floor u ||X||_F here: the same full rank as float32
        assert float(r16["numerical_rank"]) == float(r32["numerical_rank"]) == 32, point


def test_minilm_in_bfloat16_probe_reports_the_float32_rank():
    from rankcollapse.models import probe

    loaded = load_model("minilm")
    w = make_windows([TEXT], loaded.tokenizer, n_tokens=32, n_samples=1)
    r32 = probe(loaded, w, metrics=("rank_fraction",))
    loaded.model.to(torch.bfloat16)
    r16 = probe(loaded, w, metrics=("rank_fraction",))
    assert (r16["mean"] > 0).all()  # was 0.0 at every layer
    assert r16["mean"].tolist() == r32["mean"].tolist() == [1.0] * 7
