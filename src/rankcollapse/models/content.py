"""Token embeddings without the absolute position embeddings ("content" embeddings).

A model with a learned position table (BERT/MiniLM, RoBERTa and ALBERT: 512 rows;
GPT-2: 1,024) has no embedding for a window longer than its table. To compare windows
of every length N like with like (the sequence-length axis of the temperature claims,
docs/reproduce.md), X(0) is then formed by the model's own embedding layer with the
position term left out, at every N:

- BERT, RoBERTa, ALBERT (``embeddings.word_embeddings/token_type_embeddings/LayerNorm``):
  ``X(0) = LayerNorm(E_word[ids] + E_type[0])``, the module's forward
  (``transformers`` ``BertEmbeddings.forward``) with ``position_embeddings`` removed; the
  same sum in the same order, so it equals that forward with a zeroed position table
  bit for bit (tests/models/test_models_content.py); ALBERT then projects it to the
  hidden size (``encoder.embedding_hidden_mapping_in``), as X(0) of its blocks is;
- GPT-2: ``X(0) = wte[ids]`` (``GPT2Model.forward`` adds ``wpe`` to it; no norm).

Dropout is not applied (models are loaded in eval mode, where it is the identity).
"""

from __future__ import annotations

from typing import Any

import torch

from ..data import Windows
from ..errors import ModelError
from .loading import LoadedModel

#: Families whose embedding layer adds an absolute position table that can be left out.
CONTENT_FAMILIES = ("bert", "roberta", "albert", "gpt2")


def _base(model: Any) -> Any:
    return getattr(model, getattr(model, "base_model_prefix", ""), model)


@torch.no_grad()
def content_embeddings(loaded: LoadedModel, windows: Windows, *, batch_size: int = 8) -> torch.Tensor:
    """X(0) of ``windows`` without position embeddings (module docstring).

    Parameters
    ----------
    loaded : a :class:`~rankcollapse.models.LoadedModel` of a family in
        :data:`CONTENT_FAMILIES`.
    windows : token windows of any length N (the position table does not limit it).
    batch_size : windows per embedding call (the result does not depend on it).

    Returns
    -------
    torch.Tensor, shape (B, N, d), the model's dtype, on CPU.

    Raises
    ------
    ModelError
        A family without an absolute position table in its embedding layer (T5's
        relative bias and Llama's RoPE act inside attention, not on X(0)).
    """
    base = _base(loaded.model)
    emb = getattr(base, "embeddings", None)
    if loaded.family in ("bert", "roberta", "albert") and emb is not None:
        project = base.encoder.embedding_hidden_mapping_in if loaded.family == "albert" else None
        fn = _bert_like(emb, project)
    elif loaded.family == "gpt2" and hasattr(base, "wte"):
        fn = base.wte
    else:
        raise ModelError(f"X(0) without position embeddings is defined for the families {', '.join(CONTENT_FAMILIES)} "
                         f"(an absolute position table added in the embedding layer); {loaded.name!r} is "
                         f"{loaded.family!r}")
    device = loaded.device
    parts = [fn(w.input_ids.to(device)).cpu() for _, w in windows.batches(batch_size)]
    return torch.cat(parts, dim=0)


def _bert_like(emb: Any, project: Any = None):
    def fn(ids: torch.Tensor) -> torch.Tensor:
        x = emb.LayerNorm(emb.word_embeddings(ids) + emb.token_type_embeddings(torch.zeros_like(ids)))
        return x if project is None else project(x)

    return fn
