"""Tiny randomly initialised configs of every model family the toolkit is tested on."""

import torch
import transformers as tf

VOCAB = 97
H, L, HEADS, FF = 32, 3, 4, 64

CONFIGS = {
    "bert": lambda: tf.BertConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS,
                                  intermediate_size=FF),
    "roberta": lambda: tf.RobertaConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS,
                                        intermediate_size=FF, pad_token_id=1),
    "distilbert": lambda: tf.DistilBertConfig(vocab_size=VOCAB, dim=H, n_layers=L, n_heads=HEADS, hidden_dim=FF),
    "albert": lambda: tf.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=H, num_hidden_layers=L,
                                      num_attention_heads=HEADS, intermediate_size=FF),
    "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=H, n_layer=L, n_head=HEADS, bos_token_id=0, eos_token_id=0),
    "gpt_neox": lambda: tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L,
                                         num_attention_heads=HEADS, intermediate_size=FF),
    "opt": lambda: tf.OPTConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS,
                                ffn_dim=FF, word_embed_proj_dim=H, pad_token_id=1),
    "t5": lambda: tf.T5Config(vocab_size=VOCAB, d_model=H, d_kv=8, d_ff=FF, num_layers=2, num_heads=HEADS,
                              decoder_start_token_id=0, pad_token_id=0),
    "llama": lambda: tf.LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
                                    num_attention_heads=HEADS, num_key_value_heads=2),
    "mistral": lambda: tf.MistralConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
                                        num_attention_heads=HEADS, num_key_value_heads=2, sliding_window=None),
    "qwen2": lambda: tf.Qwen2Config(vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
                                    num_attention_heads=HEADS, num_key_value_heads=2),
    "gemma": lambda: tf.GemmaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
                                    num_attention_heads=HEADS, num_key_value_heads=2, head_dim=8),
    "phi": lambda: tf.PhiConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=FF, num_hidden_layers=L,
                                num_attention_heads=HEADS),
}
#: families of the registry; the rest use the generic layout, whose blocks the toolkit knows for
#: these four (every intervention works there too, drop included)
FULL = {"bert", "roberta", "albert", "gpt2", "t5", "llama", "mistral", "qwen2", "gemma"}


def build(kind: str, attn_implementation: str | None = None):
    """A seeded tiny base model of ``kind`` in eval mode (a plain transformers object)."""
    torch.manual_seed(0)
    kw = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    return tf.AutoModel.from_config(CONFIGS[kind](), **kw).eval()


def ids(n_windows: int = 2, length: int = 8, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, VOCAB, (n_windows, length), generator=torch.Generator().manual_seed(seed))


def word_docs(path, words: list[str], n_words: int, n_docs: int = 8, seed: int = 0):
    """Write ``n_docs`` lines of ``n_words`` words drawn from ``words`` to ``path`` (a
    text file with a real vocabulary for the text-file probes); returns ``path``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    path.write_text("\n".join(" ".join(rng.choice(words, n_words)) for _ in range(n_docs)) + "\n", encoding="utf-8")
    return path
