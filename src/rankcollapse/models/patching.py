"""Activation patching: a point (or one head) recorded on clean windows replaces that of
the corrupted windows, window for window, through an edit (:mod:`rankcollapse.models.edits`).
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd
import torch

from ..errors import ConfigError
from ..summary import summary_table
from .edits import EditContext, is_heads_point, split_heads, n_heads
from .loading import as_loaded
from .probe import Intervention, probe, record_points


def patch(loaded: Any, clean: Any, corrupted: Any, *, point: str, head: int | None = None,
          metrics: Sequence[str] | None = None, points: Sequence[str] | str = "hidden_states",
          batch_size: int = 8) -> pd.DataFrame:
    """Activation patching: the change of each probed metric when ``point`` (or one head)
    of the clean run replaces that of the corrupted run.

    Parameters
    ----------
    loaded : LoadedModel or a transformers model.
    clean, corrupted : :class:`~rankcollapse.data.Windows` of the same shape and padding.
    point : a point name (``layer.3.output``, ``layer.3.heads``...) or ``module:PATH``.
    head : with ``point="layer.k.heads"``: patch only this head (0-based).
    metrics, points, batch_size : as :func:`~rankcollapse.models.probe`.

    Returns
    -------
    pandas.DataFrame
        The probe's layout, of the per-window change ``patched − corrupted`` (with
        ``values``). ``attrs``: ``model``, ``family``, ``patch_point``, ``patch_head``,
        ``n_samples``.

    Raises
    ------
    ConfigError
        Windows of different shapes or padding, or a bad ``head``.
    ModelError
        An unknown point.

    See Also
    --------
    rankcollapse.models.HeadAblation : remove heads instead of patching them.
    rankcollapse.models.edits.Editor : the edit that puts the clean tensor in place.

    Examples
    --------
    >>> import torch, transformers
    >>> _ = torch.manual_seed(0)
    >>> config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, bos_token_id=0, eos_token_id=0)
    >>> model = transformers.GPT2Model(config).eval()  # a tiny randomly initialised GPT-2
    >>> from rankcollapse.data import Windows
    >>> def windows(seed):
    ...     ids = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(seed))
    ...     return Windows(ids, torch.ones_like(ids), torch.zeros_like(ids, dtype=torch.bool))
    >>> df = patch(model, windows(0), windows(1), point="layer.0.heads", head=1, metrics=["mu"])
    >>> print(df[["layer", "point"]].assign(changed=df["mean"] != 0).to_string(index=False))
     layer          point  changed
         0     embeddings    False
         1 layer.0.output     True
         2 layer.1.output     True
         2     final_norm     True
    """
    loaded = as_loaded(loaded)
    if tuple(clean.input_ids.shape) != tuple(corrupted.input_ids.shape):
        raise ConfigError(f"patch: clean windows {tuple(clean.input_ids.shape)} and corrupted windows "
                          f"{tuple(corrupted.input_ids.shape)} differ in shape; patching needs the same (B, N)")
    if not torch.equal(clean.attention_mask.bool(), corrupted.attention_mask.bool()):
        raise ConfigError("patch: clean and corrupted windows have different padding; patching needs the same "
                          "real tokens in both")
    if head is not None:
        if not is_heads_point(point):
            raise ConfigError(f"applies at a point layer.k.heads, not {point!r}", argument="head")
        H = n_heads(loaded.model)
        if not 0 <= head < H:
            raise ConfigError(f"{head} outside 0..{H - 1}", argument="head")
    source = record_points(loaded, clean, [point], batch_size=batch_size)[point]
    if head is not None:
        source = split_heads(source, H, point)

    def fn(X: torch.Tensor, ctx: EditContext) -> torch.Tensor:
        rows = source[ctx.windows.start: ctx.windows.stop].to(X)
        if head is None:
            return rows
        X = X.clone()
        X[:, :, head] = rows[:, :, head]
        return X

    kw = dict(metrics=metrics, points=points, batch_size=batch_size, per_window=True, progress=False)
    base = probe(loaded, corrupted, **kw)
    patched = probe(loaded, corrupted, Intervention(edits={point: fn}), **kw)
    changes = {(int(a.layer), a.point, a.metric): b_values - a.values
               for a, b_values in zip(base.itertuples(index=False), patched["values"])}
    df = summary_table(changes, per_window=True)
    df.attrs.update(model=base.attrs.get("model"), family=base.attrs.get("family"), patch_point=point,
                    patch_head=head, n_samples=corrupted.n_samples)
    return df
