"""A custom mask never lets padding feed a real token."""

import pytest
import torch

from rankcollapse.errors import MaskError
from rankcollapse.models import Recorder, intervene, load_model, model_inputs

from family_configs import build, ids


def _mask_row3_only_key30(n: int = 32) -> torch.Tensor:
    M = torch.ones(n, n, dtype=torch.bool)
    M[3] = False
    M[3, 30] = True
    return M


def _padding(n=32, real=24, batch=1):
    am = torch.zeros(batch, n, dtype=torch.long)
    am[:, :real] = 1
    return am


def test_real_token_left_with_only_padding_keys_is_an_error_naming_the_row():
    loaded = load_model("minilm")  # the case as reported: positions 24-31 padding
    x = torch.randint(1000, 2000, (1, 32), generator=torch.Generator().manual_seed(0))
    am = _padding()
    with pytest.raises(MaskError, match=r"rows \[3\] allow no key"):
        with intervene(loaded, mask=_mask_row3_only_key30(), attention_mask=am):
            pass


@pytest.mark.parametrize("kind", ["bert", "gpt2", "llama"])
def test_padding_ids_do_not_change_real_tokens_under_a_custom_mask(kind):
    model = build(kind)
    n, real = 12, 9
    M = torch.ones(n, n, dtype=torch.bool).tril() | torch.eye(n, dtype=torch.bool).roll(1, 1)  # every row has a real key
    am = _padding(n, real, batch=2)
    x = ids(2, n)
    outs = []
    for pad_id in (3, 50):
        xp = x.clone()
        xp[:, real:] = pad_id
        with intervene(model, mask=M, attention_mask=am), Recorder(model) as rec, torch.no_grad():
            model(**model_inputs(model, xp, am))
        outs.append({k: v[:, :real] for k, v in rec.outputs.items()})
    for k in outs[0]:
        assert torch.equal(outs[0][k], outs[1][k]), k


def test_padding_rows_may_lose_every_key():
    model = build("bert")
    n = 8
    M = torch.eye(n, dtype=torch.bool)
    M[6, 6] = False
    M[6, 7] = True  # a padding row that sees only padding: allowed
    with intervene(model, mask=M, attention_mask=_padding(n, 6)):
        pass


def test_probe_records_interaction_energy_of_the_real_tokens_per_layer():
    """probe(metrics=["interaction_energy"]) gives, per hidden state, the mean over windows
    of E_1 of each window's real tokens alone (a padded window's padding rows left out), as
    the metric on the plain forward's hidden states cut to the real rows."""
    import numpy as np

    from rankcollapse.data import Windows
    from rankcollapse.metrics import interaction_energy
    from rankcollapse.models import probe

    model = build("bert")
    n, real = 12, 8
    x, am = ids(2, n), torch.ones(2, n, dtype=torch.long)
    am[1, real:] = 0
    table = probe(model, Windows(x, am, torch.zeros(2, n, dtype=torch.bool)), metrics=["interaction_energy"])
    with torch.no_grad():
        hidden = model(input_ids=x, attention_mask=am, output_hidden_states=True).hidden_states
    rows = table[table.metric == "interaction_energy"].sort_values("layer")
    assert list(rows["layer"]) == list(range(len(hidden)))
    for (_, row), h in zip(rows.iterrows(), hidden):
        want = [float(interaction_energy(h[0].double())), float(interaction_energy(h[1, :real].double()))]
        assert row["mean"] == pytest.approx(np.mean(want), rel=1e-5)
