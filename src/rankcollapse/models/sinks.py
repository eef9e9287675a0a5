"""Attention sinks: how much attention the first token receives, and what it passes on
(``sink_mass``, ``sink_value_ratio``, ``sink_contribution``, ``sink_head_fraction``;
docs/models.md, "Trained-model geometry"). Per head at ``{prefix}layer.k.attention.head_h``;
per block at ``{prefix}layer.k.attention`` the mean over heads (the sum for
``sink_contribution``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..errors import ConfigError, ModelError
from .families import Stack, Tap
from .interventions import stack_padding
from .recorder import _PointHooks

SINK_METRICS = ("sink_mass", "sink_head_fraction", "sink_value_ratio", "sink_contribution")
#: The sink metrics that read the value projection (:class:`ValueRecorder`).
VALUE_METRICS = ("sink_value_ratio", "sink_contribution")
#: A head is a sink head when the first token receives at least half of its attention (mean over
#: queries): then it outweighs all other keys together, which no content-based pattern does on every query.
SINK_THRESHOLD = 0.5

_VALUE_ATTRS = ("v_proj", "value", "v")  # Llama, BERT/ALBERT, T5
_HEAD_DIM_ATTRS = ("head_dim", "attention_head_size", "key_value_proj_dim")


def first_real(padding_mask: torch.Tensor) -> torch.Tensor:
    """Index ``(B,)`` of each window's first real token."""
    return padding_mask.to(torch.int64).argmax(dim=-1)


def first_token_mass(A: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """``sink_mass`` float64 ``(B, H)`` of probabilities ``A`` ``(B, H, N, N)`` and the
    padding mask ``(B, N)``; ``sink_contribution`` when ``A`` holds contribution weights.
    :class:`ModelError` for a window with fewer than 2 real tokens."""
    pm = padding_mask.to(A.device).bool()
    f = first_real(pm)
    queries = pm.clone()
    queries[torch.arange(len(f)), f] = False
    n = queries.sum(dim=-1)
    if bool((n == 0).any()):
        raise ModelError("sink_mass needs windows of at least 2 real tokens")
    col = A.double()[torch.arange(len(f)), :, :, f]  # (B, H, N): A[b, h, i, f_b]
    col = torch.where(queries.unsqueeze(1), col, 0.0)  # rows left out may be NaN (a zero output)
    return col.sum(dim=-1) / n.unsqueeze(1)


def value_norm_ratio(V: torch.Tensor, n_heads: int, head_dim: int, padding_mask: torch.Tensor) -> torch.Tensor:
    """``sink_value_ratio`` float64 ``(B, n_heads)`` of the value projection's output ``V``
    ``(B, N, n_kv * head_dim)`` (numpy's median over the real tokens)."""
    norms = head_values(V.double(), n_heads, head_dim).norm(dim=-1)  # (B, n_heads, N)
    pm = padding_mask.to(V.device).bool()
    f = first_real(pm)
    out = torch.empty(V.shape[0], n_heads, dtype=torch.float64, device=V.device)
    for b in range(V.shape[0]):  # windows differ in real length only under padding
        out[b] = norms[b, :, f[b]] / torch.quantile(norms[b][:, pm[b]], 0.5, dim=1)
    return out


def head_values(V: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """``V`` ``(B, N, n_kv * head_dim)`` as one value per query head, ``(B, n_heads, N,
    head_dim)``: query head h reads key/value head ``h // (n_heads / n_kv)``.
    :class:`ModelError` for a width that is no whole number of key/value heads."""
    B, N, width = V.shape
    if width % head_dim or n_heads % (width // head_dim):
        raise ModelError(f"value width {width} is not a whole number of key/value heads of {head_dim} "
                         f"dividing {n_heads} heads")
    n_kv = width // head_dim
    return V.reshape(B, N, n_kv, head_dim).transpose(1, 2).repeat_interleave(n_heads // n_kv, dim=1)


def linear_map(module: nn.Module, width: int) -> torch.Tensor:
    """The float64 matrix ``M`` ``(width, d_out)`` of a linear module without its bias,
    ``module(x) - module(0) = x @ M``."""
    weight = next(module.parameters())
    eye = torch.eye(width + 1, width, dtype=weight.dtype, device=weight.device)  # last row: 0
    with torch.no_grad():
        out = module(eye).double()
    return out[:width] - out[width:]


def contribution_weights(A: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """Contribution weights ``C`` ``(B, H, N, N)``, float64, of probabilities ``A``
    ``(B, H, N, N)`` and each head's values after its slice of the output projection ``U``
    ``(B, H, N, d)`` (``u^h_j = W_O^h v^h_j``, bias left out):

        c^h_ij = a^h_ij <u^h_j, y_i> / ||y_i||^2,   y_i = sum_h sum_j a^h_ij u^h_j,

    so each query's weights sum to 1 over heads and keys. Closed forms: ``u^h_j = 0`` gives 0;
    one head with equal values gives ``C = A``; one value for every head and key ``C = A / H``.
    A query with ``y_i = 0`` is NaN.
    """
    A, U = A.double(), U.double()
    Y = (A @ U).sum(dim=1, keepdim=True)  # (B, 1, N, d): the layer's output at each query
    dots = Y @ U.transpose(-1, -2)  # (B, H, N, N): <y_i, u^h_j>
    return A * dots / (Y * Y).sum(dim=-1, keepdim=True)


def value_module(self_attn: nn.Module | None) -> nn.Module:
    """The value projection (``v_proj``, ``value`` or ``v``) of a self-attention module;
    :class:`ModelError` if none."""
    for attr in _VALUE_ATTRS:
        module = getattr(self_attn, attr, None)
        if isinstance(module, nn.Module):
            return module
    raise ModelError(f"no value projection ({', '.join(_VALUE_ATTRS)}) in {type(self_attn).__name__}: "
                     "sink_value_ratio and sink_contribution are supported for BERT, ALBERT, Llama and T5 layouts")


def head_dim_of(self_attn: nn.Module, config: Any, n_heads: int) -> int:
    """Width of one attention head: the module's own attribute, else ``hidden_size / n_heads``."""
    for attr in _HEAD_DIM_ATTRS:
        value = getattr(self_attn, attr, None)
        if isinstance(value, int):
            return value
    return int(config.hidden_size) // n_heads


class ValueRecorder(_PointHooks):
    """Context manager recording every block's value-projection output ``(B, N, width)``
    into ``outputs`` (``{prefix}layer.k.attention`` -> tensor); a shared module is told
    apart by call order."""

    def __init__(self, model: nn.Module, stack_list: list[Stack]):
        taps, seen = [], []
        for stack in stack_list:
            for k, parts in enumerate(stack.blocks):
                module = value_module(parts.self_attn)
                occurrence = sum(m is module for m in seen)
                taps.append((f"{stack.prefix}layer.{k}.attention", Tap(module, "output"), occurrence, None))
                seen.append(module)
        super().__init__(model, taps)
        self.outputs: dict[str, torch.Tensor] = {}

    def _visit(self, key: tuple[int, str], value: torch.Tensor) -> None:
        for name, _, _ in self._entries(key):
            self.outputs[name] = value.detach()


def head_outputs(V: torch.Tensor, out_proj: nn.Module | None, n_heads: int, head_dim: int,
                 point: str) -> torch.Tensor:
    """Each head's values after its slice of the output projection, float64
    ``(B, n_heads, N, d)``; :class:`ModelError` without a known output projection."""
    if out_proj is None:
        raise ModelError(f"{point}: no self-attention output projection the toolkit knows; "
                         "sink_contribution needs it")
    M = linear_map(out_proj, n_heads * head_dim).to(V.device)  # (H * d_head, d)
    Vh = head_values(V.double(), n_heads, head_dim)  # (B, H, N, d_head)
    return torch.einsum("bhnk,hkd->bhnd", Vh, M.reshape(n_heads, head_dim, -1))


def zeroed_heads(names: Sequence[str], edits: Mapping[str, Any] | None, ablation: Any,
                 loaded: Any) -> dict[str, list[int]]:
    """The self-attention heads a zero ablation removes, by ``{prefix}layer.k.attention``
    (:func:`sink_values` gives them no contribution); :class:`ConfigError` for
    ``sink_contribution`` with a mean ablation or an edit at a ``layer.k.heads`` point."""
    from .edits import check_ablation, is_heads_point

    if "sink_contribution" in names:
        edited = [p for p in (edits or {}) if is_heads_point(p)]
        if edited:
            raise ConfigError(f"sink_contribution cannot be measured with the edit at {edited[0]}: the heads' "
                              "outputs are then no attention-weighted sum of value vectors, which contribution "
                              "weights decompose")
        if ablation is not None and ablation.mode != "zero":
            raise ConfigError(f"mode {ablation.mode!r} sets heads to their mean output, no attention-weighted sum "
                              "of value vectors, which sink_contribution decomposes; use mode 'zero' with it",
                              argument="ablate_heads")
    if ablation is None or ablation.attention == "cross":  # cross-attention maps are not measured
        return {}
    prefix = check_ablation(loaded, ablation)
    return {f"{prefix}layer.{k}.attention": heads for k, heads in ablation.by_layer().items()}


def sink_values(attention_maps: dict[str, torch.Tensor], value_outputs: dict[str, torch.Tensor],
                stack_list: list[Stack], config: Any, padding: torch.Tensor, names: tuple[str, ...],
                zeroed: Mapping[str, Sequence[int]] | None = None) -> dict[tuple[str, str], torch.Tensor]:
    """Per-window sink metrics ``(B,)`` by ``(point, metric)``, per head at
    ``{point}.head_h`` and per block at ``{point}``; ``padding``: the batch's bool ``(B, N)``
    padding mask (keys and queries: every real token); ``zeroed`` heads (:func:`zeroed_heads`) write nothing in
    ``sink_contribution``."""
    parts = {f"{s.prefix}layer.{k}.attention": p for s in stack_list for k, p in enumerate(s.blocks)}
    out: dict[tuple[str, str], torch.Tensor] = {}
    for point, A in attention_maps.items():
        pad = stack_padding(padding, point).to(A.device)
        n_heads = A.shape[1]
        mass = first_token_mass(A, pad)
        per_head = {"sink_mass": mass}
        if any(n in VALUE_METRICS for n in names):
            dim = head_dim_of(parts[point].self_attn, config, n_heads)
        if "sink_value_ratio" in names:
            per_head["sink_value_ratio"] = value_norm_ratio(value_outputs[point], n_heads, dim, pad)
        if "sink_contribution" in names:
            U = head_outputs(value_outputs[point], parts[point].out_proj, n_heads, dim, point)
            U[:, list((zeroed or {}).get(point, ()))] = 0  # (B, H, N, d): ablated heads write nothing
            per_head["sink_contribution"] = first_token_mass(contribution_weights(A, U.to(A.device)), pad)
        for metric, v in [(m, v) for m, v in per_head.items() if m in names]:  # v: (B, H)
            out.update({(f"{point}.head_{h}", metric): v[:, h] for h in range(n_heads)})
            # contribution: the first token's share of the block's output, summed over heads
            out[(point, metric)] = v.sum(dim=1) if metric == "sink_contribution" else v.mean(dim=1)
        if "sink_head_fraction" in names:
            out[(point, "sink_head_fraction")] = (mass >= SINK_THRESHOLD).double().mean(dim=1)
    return out
