"""A pretrained model's self-attention network, repeated for many layers (docs/models.md,
"Interventions"); with ``keep=()`` it is the network ``dynamics.simulate`` runs on the
extracted weights (tests/models/test_models_attention_only_equal.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd
import torch

from ..data import Windows
from ..errors import ConfigError, ModelError
from ..masks import dense_mask
from ..metrics import compute_metrics
from . import families
from .interventions import additive_mask, intervene
from ..summary import summary_table
from .probe import PROBE_DEFAULT_METRICS, embed

def _call_block(loaded: Any, stack: families.Stack, k: int, X: torch.Tensor, mask4: torch.Tensor) -> torch.Tensor:
    block = stack.blocks[k].block
    if loaded.family == "llama":
        pos = torch.arange(X.shape[1], device=X.device)[None]
        pe = loaded.model.rotary_emb(X, position_ids=pos)
        out = block(X, attention_mask=mask4, position_embeddings=pe, position_ids=pos)
    elif loaded.family == "t5":
        bias = stack.blocks[0].self_attn.compute_bias(X.shape[1], X.shape[1], device=X.device)
        out = block(X, attention_mask=mask4, position_bias=bias)
    elif loaded.family == "albert":
        out = block(X, mask4)
    else:
        out = block(X, attention_mask=mask4)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def attention_only(loaded: Any, windows: Windows, *, depth: int, keep: Sequence[str] = ("skip", "norm"),
                   layers: Sequence[int] | None = None, mask: Any = None, d_qk_scale: float = 1.0,
                   metrics: Sequence[str] | None = None, batch_size: int = 8) -> pd.DataFrame:
    """Metrics after each of ``depth`` steps of the model's attention-only network: from the
    embeddings, each step applies a block of ``layers`` (default all, cycled) with its MLP
    dropped, and its skip and norms unless in ``keep``. T5 runs its encoder with block 0's
    position bias.

    ``mask``: default the model's own pattern, always with padding; ``d_qk_scale``: logits
    divided by its square root; ``metrics``: as :func:`rankcollapse.models.probe`.

    Returns
    -------
    pandas.DataFrame
        The probe's table with ``layer`` = step t (0 = embeddings) and ``point`` =
        ``attention_only.block.k``.

    Raises
    ------
    ConfigError
        ``depth`` < 1, unknown ``keep`` entry, block index out of range.
    ModelError
        Generic family.
    """
    if loaded.family == families.GENERIC.name:  # its blocks' own call arguments (positions, masks) are not known
        raise ModelError(f"attention_only is not supported for the generic family ({type(loaded.model).__name__}); "
                         f"supported families: {', '.join(families.REGISTRY)}")
    stack = families.stacks(loaded.model, loaded.family)[0]
    if depth < 1:
        raise ConfigError(f"depth must be >= 1, got {depth}")
    if set(keep) - {"skip", "norm"}:
        raise ConfigError(f"keep must be a subset of ('skip', 'norm'), got {tuple(keep)}")
    order = list(range(stack.n_layers)) if layers is None else list(layers)
    if not order or any(not 0 <= k < stack.n_layers for k in order):
        raise ConfigError(f"layers must be block indices in 0..{stack.n_layers - 1}, got {order}")
    names = tuple(metrics) if metrics is not None else PROBE_DEFAULT_METRICS
    drop = ["mlp"] + [c for c in ("skip", "norm") if c not in keep]
    n = windows.n_tokens
    native = families.native_mask_of(loaded)
    allowed = dense_mask(native if mask is None else mask, n)
    X_all = embed(loaded, windows, batch_size=batch_size)
    values: dict[tuple[int, str, str], list[torch.Tensor]] = {}
    for rows, w in windows.batches(batch_size):
        am = w.attention_mask.to(loaded.device)
        X = X_all[rows.start : rows.stop].to(loaded.device)
        mask4 = additive_mask(allowed, am, loaded.dtype)
        _record(values, 0, "embeddings", X, names, am.bool())
        with intervene(loaded, d_qk_scale=d_qk_scale, drop=drop):
            for t in range(1, depth + 1):
                k = order[(t - 1) % len(order)]
                X = _call_block(loaded, stack, k, X, mask4)
                _record(values, t, f"attention_only.block.{k}", X, names, am.bool())
    df = summary_table(values)
    df.attrs.update(model=loaded.name, family=loaded.family, notes=list(loaded.notes), keep=list(keep),
                    depth=depth, d_qk_scale=float(d_qk_scale), n_samples=windows.n_samples, n_tokens=n)
    return df


def _record(values: dict, layer: int, point: str, X: torch.Tensor, names: Sequence[str], real: torch.Tensor) -> None:
    for metric, v in compute_metrics(X, list(names), padding_mask=real, dtype=torch.float64).items():
        values.setdefault((layer, point, metric), []).append(v.detach().cpu().double())
