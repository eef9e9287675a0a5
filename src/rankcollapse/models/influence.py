"""Measured influence of each input position on the last token of a real model (gradient
norms, attention rollout), beside the mask-only prediction; definitions in docs/models.md,
"Influence of input positions".
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pandas as pd
import torch

from ..errors import ConfigError, ModelError
from . import families
from .interventions import intervene
from .loading import as_loaded
from .positions import check_positions
from .probe import check_token_ids, model_inputs
from .recorder import Recorder

#: Columns of the per-layer table.
COLUMNS = ("layer", "alpha", "rho_gradient", "rho_rollout", "rho_rollout_half", "rho_rollout_gradient",
           "first_token_gradient", "first_token_predicted", "n_samples")


def measure_influence(loaded: Any, windows: Any, *, mask: Any = None, batch_size: int = 4,
                      n_probes: int | None = 4, seed: int = 0) -> pd.DataFrame:
    """Per-layer Spearman ρ between the mask-only influence prediction and the measured
    influence (gradient norms, attention rollout) of each input on the last token.

    ``loaded``: a model of one stack; ``windows`` with padding are left out; ``mask``: the
    replacement mask the model runs under and the prediction is of (None: the model's own);
    ``n_probes``: Gaussian probes per layer (None: exact); ``seed`` seeds them.

    Returns
    -------
    pandas.DataFrame
        One row per layer ``k = 1..L``, columns :data:`COLUMNS`; ``df.attrs`` also holds
        ``profiles`` (name -> normalised ``(L, N)``) and ``per_window`` (``gradient``,
        ``rollout`` -> ``(W, L, N)``).

    Raises
    ------
    ModelError
        An encoder-decoder model, or no attention probabilities.
    ConfigError
        ``n_probes`` or ``batch_size`` < 1, every window padded, windows too long or ids
        beyond the embeddings.
    """
    from scipy.stats import spearmanr

    from ..masks.influence import influence, ranks_something

    loaded = as_loaded(loaded)
    if (n_probes is not None and n_probes < 1) or batch_size < 1:
        raise ConfigError(f"n_probes and batch_size must be >= 1, got {n_probes}, {batch_size}")
    stack_list = families.stacks(loaded.model, loaded.family)
    if len(stack_list) != 1:
        raise ModelError(f"influence is measured on one-stack models (encoders or decoders), not {loaded.family!r}")
    check_positions(loaded, windows.n_tokens)
    check_token_ids(loaded, windows)
    full = windows.attention_mask.bool().all(dim=1)
    if not bool(full.any()):
        raise ConfigError("every window has padding; influence on the last token needs unpadded windows")
    ids_all, am_all = windows.input_ids[full], windows.attention_mask[full]
    stack = stack_list[0]
    n_layers, n = stack.n_layers, windows.n_tokens
    gen = torch.Generator().manual_seed(seed)
    batches = [(ids_all[i:i + batch_size], am_all[i:i + batch_size]) for i in range(0, ids_all.shape[0], batch_size)]
    # alpha first, in forwards without backward, so the second pass rolls out and drops each batch's maps
    norms = np.zeros((n_layers, 2))  # sum of per-token norms: residual input, attention output
    for ids, am in batches:
        with _forward(loaded, stack, ids, am, mask) as (_, _, rec):
            norms += _norms(rec, stack)
    alpha = norms[:, 0] / norms.sum(1)
    grad_sum, half_sum = np.zeros((n_layers, n)), np.zeros((n_layers, n))
    window_grads, window_rollouts = [], []  # (B, L, N) per batch
    for ids, am in batches:
        grads, maps = _batch(loaded, stack, ids, am, n_probes, gen, mask)
        grad_sum += grads.sum(0)
        window_grads.append(grads)
        window_rollouts.append(_rollout_windows(maps, alpha))
        for half in _rollout_windows(maps, 0.5):  # summed in window order, as _window_mean
            half_sum += half
    count = len(ids_all)
    spec = families.native_mask_of(loaded) if mask is None else mask
    rollout = np.concatenate(window_rollouts)
    predicted = influence(spec, n, depth=n_layers, alpha=alpha.tolist()).profiles
    profiles = {"predicted": predicted, "gradient": _normalise(grad_sum / count),
                "rollout": _normalise(_window_mean(rollout)), "rollout_half": _normalise(half_sum / count)}
    per_window = {"gradient": np.concatenate(window_grads), "rollout": rollout}
    rows = []
    for k in range(n_layers):
        ranks = ranks_something(predicted[k])
        rho = {f"rho_{name}": float(spearmanr(predicted[k], profiles[name][k]).statistic) if ranks else float("nan")
               for name in ("gradient", "rollout", "rollout_half")}
        rows.append({"layer": k + 1, "alpha": float(alpha[k]), **rho,
                     "rho_rollout_gradient": float(spearmanr(profiles["rollout"][k], profiles["gradient"][k]).statistic),
                     "first_token_gradient": float(profiles["gradient"][k, 0]),
                     "first_token_predicted": float(predicted[k, 0]), "n_samples": count})
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    df.attrs.update(model=loaded.name, family=loaded.family, mask=str(getattr(spec, "spec", spec)), length=n,
                    profiles=profiles, per_window=per_window, n_probes=n_probes)
    return df


@contextmanager
def _forward(loaded: Any, stack: Any, ids: torch.Tensor, am: torch.Tensor, mask: Any = None) -> Iterator[Any]:
    """One forward with the block-0 input as a leaf; yields the ``hidden_states``, the leaf
    and the :class:`Recorder` of block inputs, attention outputs and maps (both passes run it,
    so alpha is fitted on the very forwards whose maps are rolled out)."""
    n_layers, p = stack.n_layers, stack.prefix
    leaf: list[torch.Tensor] = []

    def make_leaf(X: torch.Tensor, ctx: Any) -> torch.Tensor:  # an edit of the embeddings (ALBERT: first call only)
        leaf.append(X.detach().requires_grad_(True))
        return leaf[0]

    points = [f"{p}layer.{k}.{part}" for k in range(n_layers) for part in ("input", "attn_output")]
    with torch.enable_grad(), intervene(loaded, mask=mask, attention_mask=am, edits={f"{p}embeddings": make_leaf}), \
            Recorder(loaded, points, attentions=True) as rec:
        out = loaded.model(**model_inputs(loaded, ids, am), output_hidden_states=True)
        hidden = out.hidden_states
        if hidden is None or len(hidden) != n_layers + 1 or not leaf:
            raise ModelError(f"{type(loaded.model).__name__} returned no hidden states for every block")
        yield hidden, leaf[0], rec


def _batch(loaded: Any, stack: Any, ids: torch.Tensor, am: torch.Tensor, n_probes: int | None,
           gen: torch.Generator, mask: Any = None) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    """Gradient-norm profiles ``(B, L, N)`` and head-mean maps ``[layer][window] (N, N)`` of one :func:`_forward`."""
    n_layers, p = stack.n_layers, stack.prefix
    with _forward(loaded, stack, ids, am, mask) as (hidden, x, rec):
        grads = np.zeros((ids.shape[0], n_layers, ids.shape[1]))
        for k in range(n_layers):
            h_last = hidden[k + 1][:, -1, :]
            # all probes in one batched backward (vmap over the vector-Jacobian product)
            u = _probes(h_last, n_probes, gen)
            (g,) = torch.autograd.grad(h_last, x, grad_outputs=u, retain_graph=True, is_grads_batched=True)
            sq = g.detach().double().pow(2).sum((0, -1)).cpu()
            grads[:, k] = (sq / (n_probes or 1)).sqrt().numpy()
    maps = [[a.double().mean(0).cpu().numpy() for a in rec.attention_maps[f"{p}layer.{k}.attention"]]
            for k in range(n_layers)]
    return grads, maps


def _norms(rec: Recorder, stack: Any) -> np.ndarray:
    """Summed per-token norms ``(L, 2)`` of block inputs and attention outputs."""
    p = stack.prefix
    return np.array([[float(rec.outputs[f"{p}layer.{k}.{part}"].double().norm(dim=-1).sum()) for part in
                      ("input", "attn_output")] for k in range(stack.n_layers)])


def _probes(h: torch.Tensor, n_probes: int | None, gen: torch.Generator) -> torch.Tensor:
    """``n_probes`` Gaussian vectors shaped like ``h`` ``(B, d)`` (CPU generator), or the ``d`` basis vectors."""
    if n_probes is None:
        return torch.eye(h.shape[-1], dtype=h.dtype, device=h.device)[:, None, :].repeat(1, h.shape[0], 1)  # (d, B, d)
    return torch.stack([torch.randn(h.shape, generator=gen).to(dtype=h.dtype, device=h.device) for _ in range(n_probes)])


def _window_mean(per: np.ndarray) -> np.ndarray:
    """``per (W, L, N)`` summed over windows in order, divided by W."""
    out = np.zeros(per.shape[1:])
    for w in range(per.shape[0]):
        out += per[w]
    return out / per.shape[0]


def _rollout_windows(maps: list[list[np.ndarray]], alpha: Any) -> np.ndarray:
    """Row ``N-1`` of ``R_k`` of each window, ``(W, L, N)``."""
    n_layers, n_samples = len(maps), len(maps[0])
    a = np.broadcast_to(np.asarray(alpha, dtype=np.float64), (n_layers,))
    out = np.zeros((n_samples, n_layers, maps[0][0].shape[0]))
    for w in range(n_samples):
        r = np.eye(maps[0][w].shape[0])
        for k in range(n_layers):
            r = (a[k] * np.eye(r.shape[0]) + (1.0 - a[k]) * maps[k][w]) @ r
            out[w, k] = r[-1]
    return out


def _normalise(profiles: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (rows of zeros stay zero)."""
    total = profiles.sum(1, keepdims=True)
    return np.divide(profiles, total, out=np.zeros_like(profiles), where=total > 0)
