"""Hidden states on disk (models/states.py): saved by a probe and read back give the
probe's table; a plain transformers ``output_hidden_states`` dump gives the live probe's
rows at the points it holds; bad folders are refused with a ``StatesError``."""

import json
import os

import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from rankcollapse.data import Windows
from rankcollapse.errors import ConfigError, RankCollapseError, StatesError, UnsafePathError
from rankcollapse.models import Intervention, capture_states, probe, read_states, save_states, states_table
from rankcollapse.models.states import SIDECAR, STATES_FILE
from rankcollapse.points import layer_of

METRICS = ["mu", "mu_relative", "rank_fraction", "sigma_min", "avg_abs_cos", "effective_rank"]


def _full_windows(n_windows=5, length=9):
    ids = torch.randint(1, 97, (n_windows, length), generator=torch.Generator().manual_seed(2))
    return Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))


@pytest.mark.parametrize("kind", ["gpt2", "bert", "t5"])
def test_round_trip_gives_the_probe_table(kind, make_tiny, make_windows_tiny, tmp_path):
    """Save, read back, measure: the live probe's table (padding and special tokens as recorded)."""
    model, wins = make_tiny(kind), make_windows_tiny(5, 10, pad_last=4)
    live = probe(model, wins, metrics=METRICS, batch_size=2, points="all", per_window=True, progress=False)
    states = capture_states(model, wins, batch_size=2, points="all")
    save_states(tmp_path, states)
    back = read_states(tmp_path)
    assert back.points == states.points and back.window_ids == (0, 1, 2, 3, 4)
    assert back.hidden_states.dtype == torch.float32 and torch.equal(back.hidden_states, states.hidden_states)
    assert torch.equal(back.attention_mask, wins.attention_mask) and torch.equal(back.input_ids, wins.input_ids)
    table = states_table(back, METRICS, batch_size=2, per_window=True)
    pd.testing.assert_frame_equal(table, live, check_exact=False, rtol=1e-12)
    assert table.attrs == {**live.attrs, "notes": []}
    side = json.loads((tmp_path / SIDECAR).read_text())
    assert side["layout"] == ["window", "point", "token", "d"] and side["model"] == f"tiny-{kind}"
    assert side["dtype"] == "float32" and side["points"] == list(states.points)


def test_round_trip_keeps_interventions_and_exclude_special(make_tiny, make_windows_tiny, tmp_path):
    model, wins = make_tiny("gpt2"), make_windows_tiny(4, 10, pad_last=2)
    kw = dict(mask="causal_sliding_window:w=3", drop="mlp:1")
    live = probe(model, wins, Intervention(**kw), metrics=METRICS, exclude_special=True, progress=False)
    save_states(tmp_path, capture_states(model, wins, Intervention(**kw)))
    table = states_table(read_states(tmp_path), METRICS, exclude_special=True)
    pd.testing.assert_frame_equal(table, live, check_exact=False, rtol=1e-12)
    assert table.attrs["mask"] == "causal_sliding_window:w=3" and table.attrs["drop"] == ["mlp:1"]


@pytest.mark.parametrize("kind, mask", [("gpt2", None), ("bert", None), ("gpt2", "causal_sliding_window:w=3"),
                                        ("t5", None)])
def test_saved_attention_rows_give_the_probe_attention_entropy(kind, mask, make_tiny, make_windows_tiny, tmp_path):
    model, wins = make_tiny(kind), make_windows_tiny(4, 10, pad_last=3)
    metrics = ["rank_fraction", "attention_entropy"]
    live = probe(model, wins, Intervention(mask=mask), metrics=metrics, batch_size=2, progress=False)
    save_states(tmp_path, capture_states(model, wins, Intervention(mask=mask), batch_size=2, attentions=True))
    back = read_states(tmp_path)
    n_blocks = 4 if kind == "t5" else 3
    assert back.attentions.shape == (4, n_blocks, 4, 10, 10) and back.attentions.dtype == torch.float32
    assert back.attention_points[0].endswith("layer.0.attention")
    table = states_table(back, metrics, batch_size=2)
    pd.testing.assert_frame_equal(table, live, check_exact=False, rtol=1e-12)
    assert (table.loc[table["metric"] == "attention_entropy", "mean"].between(0, 1)).all()


def test_generic_decoder_states_give_the_probe_attention_metrics(make_windows_tiny, tmp_path):
    """Tiny GPT-NeoX (generic family, a causal decoder): the sidecar's ``model_type`` gives
    the table of saved states the live probe's causal allowed keys; a sidecar without it
    reads as unknown (complete keys)."""
    from family_configs import build

    from rankcollapse.models import as_loaded

    model = as_loaded(build("gpt_neox", "eager"))
    wins, metrics = make_windows_tiny(4, 10, pad_last=3), ["attention_entropy", "participation_ratio"]
    live = probe(model, wins, metrics=metrics, batch_size=2, progress=False)
    causal = probe(model, wins, Intervention(mask="causal"), metrics=metrics, batch_size=2, progress=False)
    pd.testing.assert_series_equal(live["mean"], causal["mean"], check_exact=False, rtol=1e-12)
    save_states(tmp_path, capture_states(model, wins, batch_size=2, attentions=True))
    side = json.loads((tmp_path / SIDECAR).read_text())
    assert side["family"] == "generic" and side["model_type"] == "gpt_neox"
    table = states_table(read_states(tmp_path), metrics, batch_size=2)
    pd.testing.assert_frame_equal(table, live, check_exact=False, rtol=1e-12)
    del side["model_type"]
    (tmp_path / SIDECAR).write_text(json.dumps(side))
    assert read_states(tmp_path).model_type is None


def test_save_states_writes_only_its_own_names(make_tiny, make_windows_tiny, tmp_path):
    """Through the output-folder module: a user's folder or a planted link is refused, untouched."""
    states = capture_states(make_tiny("gpt2"), make_windows_tiny())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="non-empty folder that no run wrote"):
        save_states(tmp_path / "mine", states)
    save_states(tmp_path / "mine", states, allow_nonempty=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    (tmp_path / "linked").mkdir()
    (tmp_path / "victim.json").write_text("{}")
    (tmp_path / "linked" / SIDECAR).symlink_to(tmp_path / "victim.json")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        save_states(tmp_path / "linked", states, allow_nonempty=True)
    assert (tmp_path / "victim.json").read_text() == "{}"


def test_bad_attention_rows_are_refused(make_tiny, make_windows_tiny, tmp_path):
    save_states(tmp_path, capture_states(make_tiny("gpt2"), make_windows_tiny(), attentions=True))
    A = read_states(tmp_path).attentions
    _rewrite(tmp_path, attentions=A[:, :2].contiguous())
    with pytest.raises(StatesError, match=r"attentions is torch.float32 \(3, 2, 4, 10, 10\); expected"):
        read_states(tmp_path)
    bad = A.clone()
    bad[0, 0, 0, 0, 0] = float("nan")
    _rewrite(tmp_path, attentions=bad)
    with pytest.raises(StatesError, match="attentions holds NaN or inf"):
        read_states(tmp_path)
    _rewrite(tmp_path, attentions=A)
    _edit_sidecar(tmp_path, attention_points=["layer.0.attention", "layer.1.attention", "layer.5.attention"])
    with pytest.raises(StatesError, match="'layer.5.attention' is not an attention point"):
        read_states(tmp_path)
    _edit_sidecar(tmp_path, attention_points=[])
    with pytest.raises(StatesError, match="attention_points and the tensor attentions come together"):
        read_states(tmp_path)


def test_attention_entropy_needs_saved_rows(saved):
    with pytest.raises(ConfigError, match="probe --save-states DIR --attentions"):
        states_table(read_states(saved), ["attention_entropy"])


@pytest.mark.parametrize("kind, last", [("gpt2", "final_norm"), ("bert", "layer.2.output")])
@pytest.mark.parametrize("numbered", [False, True])
def test_transformers_dump_gives_the_live_table(kind, last, numbered, make_tiny, tmp_path):
    """A plain transformers script: ``output_hidden_states=True``, one safetensors file
    and the config. GPT-2's last entry is after ``ln_f`` and is labelled ``final_norm``
    (the probe's ``layer.2.output`` is before it and is not in the dump); BERT's is the
    last block's output."""
    model, wins = make_tiny(kind).model, _full_windows()
    with torch.no_grad():
        out = model(input_ids=wins.input_ids, attention_mask=wins.attention_mask, output_hidden_states=True)
    hs = out.hidden_states  # L + 1 tensors (B, N, d)
    tensors = ({f"hidden_states.{i}": h.contiguous() for i, h in enumerate(hs)} if numbered
               else {"hidden_states": torch.stack(hs).contiguous()})
    save_file({**tensors, "attention_mask": wins.attention_mask}, str(tmp_path / "hidden_states.safetensors"))
    model.config.save_pretrained(tmp_path)

    states = read_states(tmp_path)
    assert states.points == ("embeddings", "layer.0.output", "layer.1.output", last)
    assert states.hidden_states.shape == (5, 4, 9, 32)
    table = states_table(states, METRICS)
    live = probe(model, wins, metrics=METRICS, progress=False)
    live = live[live["point"].isin(states.points)].reset_index(drop=True)
    pd.testing.assert_frame_equal(table, live, check_exact=False, rtol=1e-5, atol=1e-6)  # float32 forward passes


@pytest.mark.parametrize("kind", ["bert", "roberta", "albert", "gpt2", "t5", "llama"])
def test_family_final_norm_is_the_layout_s(kind, make_tiny):
    """The registry's ``final_norm`` (how a dump's last entry is labelled) is what the layout finds."""
    from rankcollapse.models import families

    loaded = make_tiny(kind)
    assert families.family(loaded.family).final_norm == (families.stacks(loaded.model, loaded.family)[0].final_norm
                                                         is not None)


def test_layer_of_matches_the_probe_layer_column():
    assert [layer_of(p, 3) for p in ("embeddings", "layer.0.input", "layer.0.norm_1", "layer.2.output",
                                     "final_norm")] == [0, 0, 1, 3, 3]
    with pytest.raises(ValueError, match="layer.3.output"):
        layer_of("layer.3.output", 3)


@pytest.fixture
def saved(make_tiny, make_windows_tiny, tmp_path):
    """A states folder of a tiny GPT-2 (5 points, the last window right-padded by 3)."""
    save_states(tmp_path, capture_states(make_tiny("gpt2"), make_windows_tiny()))
    return tmp_path


def _rewrite(folder, **changes):
    from safetensors.torch import load_file

    t = load_file(str(folder / STATES_FILE))
    t.update(changes)
    save_file({k: v for k, v in t.items() if v is not None}, str(folder / STATES_FILE))


def _edit_sidecar(folder, **changes):
    side = json.loads((folder / SIDECAR).read_text())
    side.update(changes)
    (folder / SIDECAR).write_text(json.dumps(side))


def test_bad_folders_are_refused(saved, tmp_path_factory):
    with pytest.raises(StatesError, match="neither"):
        read_states(tmp_path_factory.mktemp("empty"))
    with pytest.raises(StatesError, match="does not exist"):
        read_states(saved / "nowhere")
    hs = read_states(saved).hidden_states

    nan = hs.clone()
    nan[1, 2, 0, 0] = float("nan")
    _rewrite(saved, hidden_states=nan)
    with pytest.raises(StatesError, match="NaN or inf at layer.1.output of window 1"):
        read_states(saved)
    padded = hs.clone()
    padded[2, :, -1] = float("nan")  # a padding token of window 2: not measured, not refused
    _rewrite(saved, hidden_states=padded)
    assert read_states(saved).hidden_states.shape == hs.shape

    _rewrite(saved, hidden_states=hs[:, :4].contiguous())
    with pytest.raises(StatesError, match=r"\(3, 4, 10, 32\) does not match .* 5 points"):
        read_states(saved)
    _rewrite(saved, hidden_states=hs.double())
    with pytest.raises(StatesError, match="dtype 'float32' but hidden_states is float64"):
        read_states(saved)
    _rewrite(saved, hidden_states=hs, attention_mask=torch.full((3, 10), 2))
    with pytest.raises(StatesError, match="other than 0 and 1"):
        read_states(saved)
    _rewrite(saved, attention_mask=torch.ones(3, 9, dtype=torch.long))
    with pytest.raises(StatesError, match=r"attention_mask is torch.int64 \(3, 9\)"):
        read_states(saved)
    _rewrite(saved, attention_mask=torch.ones(3, 10, dtype=torch.long), extra=torch.zeros(1))
    with pytest.raises(StatesError, match="unknown tensor 'extra'"):
        read_states(saved)
    _rewrite(saved, extra=None)
    assert read_states(saved).points[-1] == "final_norm"

    _edit_sidecar(saved, points=["embeddings", "layer.0.output", "layer.1.output", "layer.7.output", "final_norm"])
    with pytest.raises(StatesError, match="'layer.7.output' is not a point name"):
        read_states(saved)
    _edit_sidecar(saved, points=["embeddings", "layer.0.output", "layer.1.output", "layer.2.output", "final_norm"], window_ids=[0, 1])
    with pytest.raises(StatesError, match="does not match the 2 window ids"):
        read_states(saved)
    for ids in ([0, 0, 1], [-1, 0, 1]):  # each window is one row of the windows it came from
        _edit_sidecar(saved, window_ids=ids)
        with pytest.raises(StatesError, match=r"window_ids \(distinct rows >= 0\)"):
            read_states(saved)
    _edit_sidecar(saved, window_ids=[0, 1, 2], model_type=["gpt2"])
    with pytest.raises(StatesError, match="model_type must be a string"):
        read_states(saved)
    _edit_sidecar(saved, format="something else")
    with pytest.raises(StatesError, match="not a rankcollapse.states sidecar"):
        read_states(saved)
    (saved / SIDECAR).unlink()
    with pytest.raises(StatesError, match="states.json' is missing"):
        read_states(saved)
    assert issubclass(StatesError, RankCollapseError)


@pytest.mark.parametrize("changes, message", [
    ({"version": True}, "version must be the integer 1, got True"),  # True == 1 in Python
    ({"version": 1.0}, "version must be the integer 1, got 1.0"),
    ({"d_qk_scale": -1}, "d_qk_scale must be a finite number > 0, got -1"),
    ({"d_qk_scale": 0}, "d_qk_scale must be a finite number > 0, got 0"),
    ({"d_qk_scale": True}, "d_qk_scale must be a finite number > 0, got True"),
    ({"d_qk_scale": None}, "d_qk_scale must be a finite number > 0, got None"),
    ({"d_qk_scale": "2"}, "d_qk_scale must be a finite number > 0, got '2'"),
    ({"d_qk": -4.0}, "d_qk must be a finite number > 0, got -4.0"),
    ({"family": "martian"}, "family 'martian' is not a model family; known: bert, roberta, albert, gpt2, t5, llama, "
                            "generic"),
    ({"family": ["gpt2"]}, "family ['gpt2'] is not a model family"),
    ({"mask": 123}, "mask must be null or a mask spec string, got 123"),  # was reported as the mask
    ({"mask": ""}, "mask must be null or a mask spec string, got ''"),
    ({"drop": "mlp"}, 'drop must be a list of components such as ["mlp", "skip:0-2"], got \'mlp\''),
    ({"drop": ["bogus"]}, "drop ['bogus']: unknown component to drop 'bogus'; choose from skip, mlp, norm, final_norm"),
    ({"clip_massive": "no"}, "clip_massive must be true or false, got 'no'"),  # was reported as clipped
    ({"model": 5}, "model must be null or a string, got 5"),
    ({"edits": "x"}, "edits must be a list of point names, got 'x'"),
    ({"ablate_heads": [[0, 1]]}, 'ablate_heads must be {"heads": [[layer, head], ...], ...}, got [[0, 1]]'),
])
def test_odd_sidecar_values_are_refused(saved, changes, message):
    """What save_states never writes is refused with one StatesError naming the field; what it
    writes reads back (the round-trip tests, and here d_qk set and family generic or null)."""
    _edit_sidecar(saved, d_qk=16.0, family="generic")
    assert read_states(saved).settings["d_qk"] == 16.0 and read_states(saved).family == "generic"
    _edit_sidecar(saved, d_qk=None, family=None)
    assert read_states(saved).settings["d_qk_scale"] == 1.0
    _edit_sidecar(saved, **changes)
    with pytest.raises(StatesError) as info:
        read_states(saved)
    assert str(info.value).startswith(f"{str(saved / SIDECAR)!r}: {message}")


def test_unreadable_tensor_files_are_refused(saved):
    (saved / STATES_FILE).write_bytes(b"not safetensors at all")
    with pytest.raises(StatesError, match="not a readable safetensors file"):
        read_states(saved)
    (saved / STATES_FILE).unlink()
    os.mkfifo(saved / STATES_FILE)  # a FIFO would block a plain read: refused at once
    with pytest.raises(UnsafePathError, match="not a regular file"):
        read_states(saved)


def test_dump_refusals(make_tiny, tmp_path):
    model = make_tiny("gpt2").model
    save_file({"hidden_states": torch.zeros(4, 2, 5, 32)}, str(tmp_path / "hidden_states.safetensors"))
    with pytest.raises(StatesError, match="no config.json"):
        read_states(tmp_path)
    model.config.save_pretrained(tmp_path)
    save_file({"hidden_states.0": torch.zeros(2, 5, 32), "hidden_states.2": torch.zeros(2, 5, 32)},
              str(tmp_path / "hidden_states.safetensors"))
    with pytest.raises(StatesError, match=r"hidden_states.0 ... hidden_states.L"):
        read_states(tmp_path)
    save_file({"hidden_states": torch.zeros(4, 5, 32)}, str(tmp_path / "hidden_states.safetensors"))
    with pytest.raises(StatesError, match=r"shape \(4, 5, 32\), expected \(L \+ 1, B, N, d\)"):
        read_states(tmp_path)
    save_file({"hidden_states": torch.ones(3, 2, 5, 32)}, str(tmp_path / "hidden_states.safetensors"))
    with pytest.raises(StatesError, match="holds 3 hidden states, but .* gives the model 3 layers"):
        read_states(tmp_path)  # 2 blocks' states under a 3-block config: every label would be wrong
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "opt"}))
    with pytest.raises(StatesError, match="model_type 'opt' is not a family"):
        read_states(tmp_path)


def test_module_points_and_attention_metrics_are_refused(make_tiny, make_windows_tiny, saved):
    with pytest.raises(ConfigError, match="module:h.0.attn"):
        capture_states(make_tiny("gpt2"), make_windows_tiny(), points="hidden_states,module:h.0.attn")
    with pytest.raises(ConfigError, match="has no spec for states.json"):
        capture_states(make_tiny("gpt2"), make_windows_tiny(), Intervention(mask=torch.ones(10, 10, dtype=torch.bool).tril()))
    with pytest.raises(ConfigError, match="the sink metrics need the model"):
        states_table(read_states(saved), ["sink_mass"])
