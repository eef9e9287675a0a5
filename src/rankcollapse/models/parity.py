"""Parity with transformers: the probe's recorded points against ``output_hidden_states``
(docs/models.md, "Parity with transformers").
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from ..data import Windows
from ..errors import ModelError
from . import families

PARITY_COLUMNS = ("layer", "point", "max_abs_diff", "max_abs", "bound", "ok")
#: The bound on ``|Δ|`` in units of ``eps(dtype) · max|x|``.
PARITY_ULPS = 8.0


@torch.no_grad()
def parity(loaded: Any, windows: Windows, *, batch_size: int = 8) -> pd.DataFrame:
    """Per ``hidden_states`` entry, the largest ``|Δ|`` over real tokens between the probe's
    recorded point (or a TransformerLens bridge's cached one) and transformers'
    ``output_hidden_states``, against the bound ``8 · eps(dtype) · max|x|``: a table of
    :data:`PARITY_COLUMNS` (``ok``: ``max_abs_diff <= bound``).

    Raises
    ------
    ConfigError
        As :func:`~rankcollapse.models.probe` (positions, token ids).
    ModelError
        No ``hidden_states`` returned; an nnsight model.

    See Also
    --------
    check_parity : raises when an entry is above its bound.
    """
    from .lens import open_model
    from .interventions import stack_padding
    from .positions import check_positions
    from .probe import check_token_ids, model_inputs
    from .recorder import Recorder

    loaded, library = open_model(loaded)
    if library is not None and library.library != "transformer_lens":
        raise ModelError(f"parity of an {library.library} model: pass the transformers model it wraps, whose hooks "
                         "it records with")
    check_positions(loaded, windows.n_tokens)
    check_token_ids(loaded, windows)
    stack_list = families.stacks(loaded.model, loaded.family)
    labels = {s.prefix: families.hidden_states_points(loaded.family, s.n_layers, s.prefix) for s in stack_list}
    if library is not None:  # compare the points the bridge caches
        labels = {p: [n if n in library.points else None for n in names] for p, names in labels.items()}
    wanted = [p for names in labels.values() for p in names if p is not None]
    worst: dict[str, list[float]] = {p: [0.0, 0.0] for p in wanted}  # point -> [max |Δ|, max |x|]
    dtype = next(loaded.model.parameters()).dtype
    for _, w in windows.batches(batch_size):
        am = w.attention_mask
        inputs = model_inputs(loaded, w.input_ids, am)
        if library is not None:
            recorded = library.record(inputs)
        else:
            with Recorder(loaded, wanted) as rec:
                loaded.model(**inputs)
            recorded = rec.outputs
        plain = {k: v for k, v in inputs.items() if k not in ("position_ids", "use_cache")}
        out = loaded.model(**plain, output_hidden_states=True)
        for prefix, names in labels.items():
            entries = _entries(out, prefix)
            real = stack_padding(am, prefix).bool().to(entries[0].device)
            for name, ref in zip(names, entries):
                if name is None:
                    continue
                X = recorded[name].to(ref.device)
                diff = (X.double() - ref.double()).abs().amax(dim=-1)[real]
                worst[name][0] = max(worst[name][0], float(diff.max()) if diff.numel() else 0.0)
                worst[name][1] = max(worst[name][1], float(ref.double().abs().amax(dim=-1)[real].max()))
    eps = torch.finfo(dtype).eps
    rows = []
    for prefix, names in labels.items():
        for layer, name in enumerate(names):
            if name is None:
                continue
            d, scale = worst[name]
            bound = PARITY_ULPS * eps * scale
            rows.append({"layer": layer, "point": name, "max_abs_diff": d, "max_abs": scale, "bound": bound,
                         "ok": d <= bound})
    df = pd.DataFrame(rows, columns=list(PARITY_COLUMNS))
    df.attrs.update(model=loaded.name, family=loaded.family, dtype=str(dtype).removeprefix("torch."),
                    recorded_by=library.library if library is not None else "rankcollapse")
    return df


def _entries(out: Any, prefix: str) -> tuple[torch.Tensor, ...]:
    key = {"": "hidden_states", "encoder.": "encoder_hidden_states", "decoder.": "decoder_hidden_states"}[prefix]
    entries = getattr(out, key, None)
    if entries is None and prefix == "encoder.":  # a T5EncoderModel: one stack, named hidden_states
        entries = getattr(out, "hidden_states", None)
    if not entries:
        raise ModelError(f"the model returned no {key} with output_hidden_states=True; parity needs them")
    return tuple(entries)


def check_parity(table: pd.DataFrame) -> None:
    """:class:`ModelError` naming the point with the largest ``|Δ| / bound`` when any entry
    of a :func:`parity` table is above its bound."""
    bad = table[~table["ok"].astype(bool)]
    if bad.empty:
        return
    row = bad.loc[(bad["max_abs_diff"] / bad["bound"].where(bad["bound"] > 0, float("nan"))).fillna(float("inf"))
                  .idxmax()]
    raise ModelError(f"parity with transformers' output_hidden_states fails at {row['point']} (layer {row['layer']}): "
                     f"max |Δ| {row['max_abs_diff']:.3g} > bound {row['bound']:.3g} ({table.attrs.get('dtype')}, "
                     f"{len(bad)} of {len(table)} points above it)")
