"""Token embeddings without the absolute position embeddings ("content" embeddings), so
windows longer than a model's position table can be compared like with like.

- BERT, RoBERTa, ALBERT: ``X(0) = LayerNorm(E_word[ids] + E_type[0])``, the embedding
  module's forward without its position term (bit for bit that forward with a zeroed
  position table); ALBERT then projects it to the hidden size;
- GPT-2: ``X(0) = wte[ids]``.
"""

from __future__ import annotations

import torch

from ..data import Windows
from ..errors import ModelError
from .loading import LoadedModel

#: Families whose embedding layer adds an absolute position table that can be left out.
CONTENT_FAMILIES = ("bert", "roberta", "albert", "gpt2")


@torch.no_grad()
def content_embeddings(loaded: LoadedModel, windows: Windows, *, batch_size: int = 8) -> torch.Tensor:
    """X(0) ``(B, N, d)`` of ``windows`` (any N) without position embeddings, in the model's
    dtype on CPU; :class:`ModelError` for a family outside :data:`CONTENT_FAMILIES`."""
    model = loaded.model
    base = getattr(model, getattr(model, "base_model_prefix", ""), model)  # a task-head model's base
    emb = getattr(base, "embeddings", None)
    if loaded.family in ("bert", "roberta", "albert") and emb is not None:
        project = base.encoder.embedding_hidden_mapping_in if loaded.family == "albert" else None

        def fn(ids: torch.Tensor) -> torch.Tensor:  # the embedding module's forward without its position term
            x = emb.LayerNorm(emb.word_embeddings(ids) + emb.token_type_embeddings(torch.zeros_like(ids)))
            return x if project is None else project(x)
    elif loaded.family == "gpt2" and hasattr(base, "wte"):
        fn = base.wte
    else:
        raise ModelError(f"X(0) without position embeddings is defined for the families {', '.join(CONTENT_FAMILIES)} "
                         f"(an absolute position table added in the embedding layer); {loaded.name!r} is "
                         f"{loaded.family!r}")
    device = loaded.device
    parts = [fn(w.input_ids.to(device)).cpu() for _, w in windows.batches(batch_size)]
    return torch.cat(parts, dim=0)
