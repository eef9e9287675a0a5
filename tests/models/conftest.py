"""Fixtures: tiny randomly initialised models of every supported family, built from
configs, and small token windows with padding. ``make_tiny`` and ``make_windows_tiny``
are factory fixtures for tests that need a particular family or padding."""

import pytest
import torch
import transformers as tf

from rankcollapse.data import Windows
from rankcollapse.models import LoadedModel, detect_family

VOCAB = 97
CONFIGS = {
    "bert": lambda: tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=64),
    "albert": lambda: tf.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                      num_attention_heads=4, intermediate_size=64),
    "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, bos_token_id=0, eos_token_id=0),
    "t5": lambda: tf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                              decoder_start_token_id=0, pad_token_id=0),
    "llama": lambda: tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                    num_attention_heads=4, num_key_value_heads=2),
    "roberta": lambda: tf.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64),
    "distilbert": lambda: tf.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64),
}


def build_tiny(kind: str, attn_implementation: str = "eager") -> LoadedModel:
    """A tiny model of family ``kind`` (config above), seeded, eval mode."""
    torch.manual_seed(0)
    config = CONFIGS[kind]()
    model = tf.AutoModel.from_config(config, attn_implementation=attn_implementation).eval()
    return LoadedModel(model=model, tokenizer=None, family=detect_family(model), name=f"tiny-{kind}",
                       notes=["randomly initialised (not pretrained)"])


def tiny_windows(n_windows: int = 3, length: int = 10, pad_last: int = 3) -> Windows:
    """Seeded ``(n_windows, length)`` windows; the last one has ``pad_last`` padding tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (n_windows, length), generator=g)
    am = torch.ones(n_windows, length, dtype=torch.long)
    am[-1, length - pad_last :] = 0  # right padding in the last window
    special = torch.zeros(n_windows, length, dtype=torch.bool)
    special[:, 0] = True
    return Windows(ids, am, special)


@pytest.fixture(params=["bert", "albert", "gpt2", "t5", "llama"])
def tiny(request) -> LoadedModel:
    return build_tiny(request.param)


@pytest.fixture
def windows() -> Windows:
    return tiny_windows()


@pytest.fixture
def make_tiny():
    """``make_tiny(kind)``: a fresh tiny model of ``kind`` (bert, albert, gpt2, t5, llama, roberta, distilbert)."""
    return build_tiny


@pytest.fixture
def make_windows_tiny():
    """``make_windows_tiny(n_windows=3, length=10, pad_last=3)``: seeded windows, last one right-padded."""
    return tiny_windows
