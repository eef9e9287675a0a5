"""The ``power_method`` unit kind (``configs/power.yaml``; Li & Altafini, arXiv 2605.25619;
docs/reproduce.md): tokens against the principal eigenvector ``v_1^k`` of each layer's
``W_O W_V`` (:func:`rankcollapse.metrics.power.principal_eigenvector`).

Rows per layer k, with per-window values: ``v1_alignment`` ``a(X_k, v_1^k)`` (layer 0:
``a(X_0, v_1^1)``); ``v1_tilt`` ``a(X_k, v_1^k) - a(X_(k-1), v_1^k)``; ``v1_tilt_mean``
(last layer) its mean over layers; ``v1_dim`` (model units) 1 for a line, 2 for the plane
of a complex leading pair.

``network``: ``simulator`` (float64, one shared ``W_V = Q diag(λ) Qᵀ``,
:func:`value_spectrum_matrix`; ``norm`` ``sphere`` or ``layernorm``; complete mask, no
skip or MLP), ``model`` (the hidden states of ``model``'s float32 forward, or its
``control: random-init``) or ``albert`` (an ALBERT of MiniLM's shape, random-init, seed
0). ``direction: random`` replaces ``v_1`` by ``n_directions`` random lines (expected
tilt exactly 0).

Labels: ``source = power_method``; simulator rows ``model = gaussian``, ``variant =
"l2=S,rest=R"``, ``value = constructed``, ``norm``; model rows ``model`` (``albert``),
``variant = v1 | random_direction``, ``value = pretrained | random_init``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from ..errors import ConfigError
from .table import normalise, rows_from_metrics
from .units import _labels, register

NETWORKS = ("simulator", "model", "albert")
SIM_NORMS = ("sphere", "layernorm")


def value_spectrum_matrix(d_model: int, second: float, rest: float, seed: int) -> torch.Tensor:
    """The simulator's symmetric float64 ``W_V = Q diag(λ) Qᵀ`` ``(d_model, d_model)``: ``Q``
    Haar-orthogonal (``seed``) but for its first column ``1/sqrt(d)``; λ is ``rest`` there,
    1 on the second column (``v_1``), ``second`` on the third and ``rest`` elsewhere."""
    d = d_model
    if d < 3:
        raise ConfigError(f"power_method d_model must be at least 3 (v1, v2 and the LayerNorm direction), got {d}")
    g = torch.Generator().manual_seed(int(seed))
    Z = torch.randn(d, d, generator=g, dtype=torch.float64)
    Z[:, 0] = 1.0  # the first column of Q: 1 / sqrt(d) after the QR
    Q, R = torch.linalg.qr(Z)
    Q = Q * torch.sign(torch.diagonal(R))
    lam = torch.full((d,), float(rest), dtype=torch.float64)
    lam[1], lam[2] = 1.0, float(second)
    return (Q * lam) @ Q.T


def spectrum_variant(second: float, rest: float) -> str:
    """``variant`` of a simulator unit: ``"l2=0.5,rest=0.25"``."""
    return f"l2={float(second)!r},rest={float(rest)!r}"


def _tilt_rows(align: np.ndarray, before: np.ndarray) -> dict[str, tuple[list[int], np.ndarray]]:
    """``{metric: (layers, (L, W) values)}`` from ``align (L + 1, W)`` and ``before (L, W)``."""
    L = align.shape[0] - 1
    tilt = align[1:] - before
    return {"v1_alignment": (list(range(L + 1)), align), "v1_tilt": (list(range(1, L + 1)), tilt),
            "v1_tilt_mean": ([L], tilt.mean(axis=0, keepdims=True))}


def _frame(rows: dict[str, tuple[list[int], np.ndarray]]) -> pd.DataFrame:
    return pd.concat([rows_from_metrics({m: vals}, {}, layers=layers) for m, (layers, vals) in rows.items()],
                     ignore_index=True)


def simulator_rows(p: dict[str, Any]) -> pd.DataFrame:
    """Rows of one simulator unit from its parameters."""
    from ..dynamics import BlockConfig, RunConfig, simulate

    norm = str(p.get("norm", "sphere"))
    if norm not in SIM_NORMS:
        raise ConfigError(f"power_method norm must be one of {', '.join(SIM_NORMS)}, got {norm!r}")
    d, n, B, depth = int(p["d_model"]), int(p["n_tokens"]), int(p["n_samples"]), int(p["depth"])
    seed = int(p.get("draw_seed", 0))
    W_V = value_spectrum_matrix(d, float(p["second"]), float(p["rest"]), seed)
    X0 = torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    res = simulate(X0, mask="complete", block=BlockConfig(norm=norm),
                   run=RunConfig(depth=depth, seed=seed, dtype=torch.float64), value=W_V, shared=True,
                   metrics=["v1_alignment"])
    align = res.metrics["v1_alignment"].numpy()  # (depth + 1, B); one v_1 for every layer
    return _frame(_tilt_rows(align, align[:-1]))


def _albert_from_config(like: Any, seed: int) -> Any:
    """A random-init ALBERT (one shared layer) of ``like``'s shape, with ``like``'s tokenizer."""
    from transformers import AlbertConfig, AlbertModel

    from ..models.loading import as_loaded

    c = like.model.config
    cfg = AlbertConfig(vocab_size=c.vocab_size, embedding_size=128, hidden_size=c.hidden_size,
                       num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                       intermediate_size=c.intermediate_size, max_position_embeddings=c.max_position_embeddings,
                       num_hidden_groups=1, inner_group_num=1, hidden_act="gelu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AlbertModel(cfg).eval()
    return as_loaded(model, like.tokenizer, name=f"albert [config of {like.name}, random-init, seed {seed}]")


def _directions(p: dict[str, Any], weights: list, d: int) -> list[torch.Tensor]:
    """Per layer the ``(R, k, d)`` subspaces the alignment reads: ``v_1`` or random lines."""
    from ..metrics.power import principal_eigenvector, value_output_map

    direction = str(p.get("direction", "v1"))
    if direction == "v1":
        return [principal_eigenvector(value_output_map(lw))[0][None] for lw in weights]  # (1, k, d)
    if direction != "random":
        raise ConfigError(f"power_method direction must be v1 or random, got {direction!r}")
    g = torch.Generator().manual_seed(int(p.get("draw_seed", 0)))
    U = torch.randn(len(weights), int(p.get("n_directions", 16)), d, generator=g, dtype=torch.float64)
    return list((U / torch.linalg.vector_norm(U, dim=-1, keepdim=True))[:, :, None])


def model_rows(p: dict[str, Any], loaded: Any, windows: Any) -> pd.DataFrame:
    """Rows of one model unit: ``loaded``'s hidden states on ``windows``."""
    from ..dynamics.pretrained import extract_attention_weights
    from ..metrics.power import v1_alignment
    from ..models.probe import model_inputs

    weights = extract_attention_weights(loaded.model)
    pad = windows.attention_mask.bool()
    with torch.no_grad():
        out = loaded.model(**model_inputs(loaded, windows.input_ids, windows.attention_mask), output_hidden_states=True)
    H = [h.detach().double().cpu() for h in out.hidden_states]  # L + 1 of (W, N, d)
    if len(H) != len(weights) + 1:
        raise ConfigError(f"{loaded.name}: {len(H)} hidden states for {len(weights)} attention layers")
    U = _directions(p, weights, H[0].shape[-1])

    def a(X: torch.Tensor, dirs: torch.Tensor) -> np.ndarray:
        return torch.stack([v1_alignment(X, u, padding_mask=pad) for u in dirs]).mean(0).numpy()

    align = np.stack([a(H[0], U[0])] + [a(H[k], U[k - 1]) for k in range(1, len(H))])
    before = np.stack([a(H[k - 1], U[k - 1]) for k in range(1, len(H))])
    rows = _tilt_rows(align, before)
    rows["v1_dim"] = (list(range(1, len(H))), np.array([[float(u.shape[1])] for u in U]))
    return _frame(rows)


def run_power_method(unit: Any, ctx: Any) -> pd.DataFrame:
    """The ``power_method`` unit kind (module docstring)."""
    p = unit.params
    network = str(p.get("network", "simulator"))
    if network not in NETWORKS:
        raise ConfigError(f"power_method network must be one of {', '.join(NETWORKS)}, got {network!r}")
    if network == "simulator":
        labels = _labels(unit, model="gaussian", variant=spectrum_variant(p["second"], p["rest"]), value="constructed",
                         norm=str(p.get("norm", "sphere")), mask="complete", mask_spec="complete", dtype="float64")
        return normalise(simulator_rows(p), labels)
    from ..models.controls import random_init

    loaded = ctx.model(p["model"])
    windows = ctx.windows(p["model"], int(p["n_samples"]))
    value = "pretrained"
    if network == "albert":
        loaded, value = _albert_from_config(loaded, int(p.get("control_seed", 0))), "random_init"
    elif p.get("control") is not None:
        if p["control"] != "random-init":
            raise ConfigError(f"unknown power_method control {p['control']!r}; choose from random-init")
        loaded, value = random_init(loaded, seed=int(p.get("control_seed", 0))), "random_init"
    variant = "v1" if str(p.get("direction", "v1")) == "v1" else "random_direction"
    labels = _labels(unit, model="albert" if network == "albert" else str(p["model"]), variant=variant, value=value,
                     mask="complete", mask_spec="complete", dtype="float32")
    return normalise(model_rows(p, loaded, windows), labels)


register("power_method", run_power_method, 1)
