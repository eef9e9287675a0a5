"""Attention sinks: how much attention the first token receives, and what it passes on.

Trained language models send most attention to the first token in many heads (an
"attention sink": Xiao et al., "Efficient Streaming Language Models with Attention
Sinks", ICLR 2024), and that token's value vector is small, so a sink head outputs almost
nothing (a no-op; Sun et al., "Massive Activations in Large Language Models", 2024,
Sec. 4). Per block k and head h (``{prefix}layer.k.attention.head_h``), over windows:

- ``sink_mass``: ``mean_{i real, i != f} A[h, i, f]``, the attention mass on the first
  real token f, averaged over the other real queries. The first token's own row is
  left out: in a causal model it can attend only to itself (mass 1 by construction).
- ``sink_value_ratio``: ``||v_f|| / median_j ||v_j||`` over the real tokens j, with v the
  head's value vectors (the output of the block's value projection, W_V x + b; heads
  that share a key/value head under grouped-query attention share it). Small: the sink
  contributes almost nothing to the head's output.
- ``sink_contribution``: ``mean_{i real, i != f} C[h, i, f]``, the share of the
  attention layer's output that head h writes from the first token, with the
  contribution weights of :func:`contribution_weights` (attention x value norm after the
  output projection x alignment with the layer output; Cunningham & Muça Cirone,
  "Contribution Weights: A Geometrical Analysis of Self-Attention Transformers", ICML
  2026, arXiv 2606.07604). Per block it is the sum over heads (the first token's share
  of the block's attention output; equal to ``sink_mass`` when every head and key writes
  the same vector). A sink reads ``sink_mass`` near 1 and ``sink_contribution`` near 0
  when the first token's values are small or orthogonal to what the layer writes.
- ``sink_head_fraction`` (per block only): the fraction of heads whose ``sink_mass`` is
  at least :data:`SINK_THRESHOLD`.

The per-block point ``{prefix}layer.k.attention`` holds the mean over heads of
``sink_mass`` and ``sink_value_ratio``, the sum over heads of ``sink_contribution``, and
the head fraction.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from ..errors import ConfigError, ModelError
from .families import Stack

SINK_METRICS = ("sink_mass", "sink_head_fraction", "sink_value_ratio", "sink_contribution")
#: The sink metrics that read the value projection (:class:`ValueRecorder`).
VALUE_METRICS = ("sink_value_ratio", "sink_contribution")
#: A head is a sink head when the first token receives at least half of its attention
#: (mean over queries): then the first token outweighs all other keys together, which no
#: content-based pattern does on every query; uniform causal attention over N = 128
#: tokens gives the first token (1/127) sum_{i=2..128} 1/i = 0.035.
SINK_THRESHOLD = 0.5

_VALUE_ATTRS = ("v_proj", "value", "v")  # Llama, BERT/ALBERT, T5
_HEAD_DIM_ATTRS = ("head_dim", "attention_head_size", "key_value_proj_dim")


def first_real(padding_mask: torch.Tensor) -> torch.Tensor:
    """Index ``(B,)`` of each window's first real token in a ``(B, N)`` padding mask."""
    return padding_mask.to(torch.int64).argmax(dim=-1)


def first_token_mass(A: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    """``sink_mass`` per window and head, float64 ``(B, H)``, from attention
    probabilities ``A`` ``(B, H, N, N)`` and the padding mask ``(B, N)`` (True = real);
    ``sink_contribution`` when ``A`` holds contribution weights (:func:`contribution_weights`).

    Raises
    ------
    ModelError
        A window with fewer than 2 real tokens (no query besides the first token).
    """
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
    """``sink_value_ratio`` per window and (query) head, float64 ``(B, n_heads)``, from
    the value projection's output ``V`` ``(B, N, n_kv * head_dim)``; query head h reads
    key/value head ``h // (n_heads / n_kv)`` (grouped-query attention). The median is
    numpy's, over the real tokens."""
    norms = head_values(V.double(), n_heads, head_dim).norm(dim=-1)  # (B, n_heads, N)
    pm = padding_mask.to(V.device).bool()
    f = first_real(pm)
    out = torch.empty(V.shape[0], n_heads, dtype=torch.float64, device=V.device)
    for b in range(V.shape[0]):  # windows differ in real length only under padding
        out[b] = norms[b, :, f[b]] / torch.quantile(norms[b][:, pm[b]], 0.5, dim=1)
    return out


def head_values(V: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """The value projection's output ``V`` ``(B, N, n_kv * head_dim)`` as one value per
    query head, ``(B, n_heads, N, head_dim)``: query head h reads key/value head
    ``h // (n_heads / n_kv)`` (grouped-query attention).

    Raises
    ------
    ModelError
        A width that is not a whole number of key/value heads dividing ``n_heads``.
    """
    B, N, width = V.shape
    if width % head_dim or n_heads % (width // head_dim):
        raise ModelError(f"value width {width} is not a whole number of key/value heads of {head_dim} "
                         f"dividing {n_heads} heads")
    n_kv = width // head_dim
    return V.reshape(B, N, n_kv, head_dim).transpose(1, 2).repeat_interleave(n_heads // n_kv, dim=1)


def linear_map(module: nn.Module, width: int) -> torch.Tensor:
    """The matrix ``M`` ``(width, d_out)`` of a linear module (``nn.Linear``, GPT-2's
    ``Conv1D``...) without its bias, so that ``module(x) - module(0) = x @ M``: read off
    by applying the module to the identity and to 0; float64."""
    weight = next(module.parameters())
    eye = torch.eye(width + 1, width, dtype=weight.dtype, device=weight.device)  # last row: 0
    with torch.no_grad():
        out = module(eye).double()
    return out[:width] - out[width:]


def contribution_weights(A: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """Contribution weights ``C`` ``(B, H, N, N)``, float64, of attention probabilities
    ``A`` ``(B, H, N, N)`` and each head's value vectors after its slice of the output
    projection ``U`` ``(B, H, N, d)`` (``u^h_j = W_O^h v^h_j``, bias left out).

    The attention layer writes ``y_i = sum_h sum_j a^h_ij u^h_j`` at query i. Key j's
    contribution weight in head h is the projection of its term ``a^h_ij u^h_j`` on
    ``y_i``, as a fraction of ``y_i``:

        c^h_ij = a^h_ij <u^h_j, y_i> / ||y_i||^2 = a^h_ij ||u^h_j|| cos(u^h_j, y_i) / ||y_i||,

    attention x value norm x alignment with the layer output, normalised so that the
    weights of each query sum to 1 over heads and keys (``sum_h sum_j c^h_ij =
    <y_i, y_i> / ||y_i||^2``); a weight is negative where the term points away from the
    output. Closed forms: a key with ``u^h_j = 0`` gets 0; with one head and equal
    values (``u_j = u != 0``) ``C = A``; with H heads and one value ``u`` for every
    head and key, ``C = A / H``, so ``sum_h c^h_ij`` is the heads' mean attention. A
    query with ``y_i = 0`` is NaN.
    """
    A, U = A.double(), U.double()
    Y = (A @ U).sum(dim=1, keepdim=True)  # (B, 1, N, d): the layer's output at each query
    dots = Y @ U.transpose(-1, -2)  # (B, H, N, N): <y_i, u^h_j>
    return A * dots / (Y * Y).sum(dim=-1, keepdim=True)


def value_module(self_attn: nn.Module | None) -> nn.Module:
    """The value projection of a self-attention module (``v_proj``, ``value`` or ``v``).

    Raises
    ------
    ModelError
        The module has none of them (e.g. GPT-2's fused ``c_attn``; a generic family).
    """
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


class ValueRecorder:
    """Context manager recording every block's value-projection output ``(B, N, width)``
    (forward hooks, removed on exit; a module shared by several blocks, as in ALBERT,
    is told apart by its call order).

    Attributes
    ----------
    outputs : dict[str, torch.Tensor]
        ``{prefix}layer.k.attention`` -> the value projection's output of block k.
    """

    def __init__(self, stack_list: list[Stack]):
        self._blocks: list[tuple[str, nn.Module, int]] = []
        for stack in stack_list:
            for k, parts in enumerate(stack.blocks):
                module = value_module(parts.self_attn)
                occ = sum(1 for name, m, _ in self._blocks if m is module)
                self._blocks.append((f"{stack.prefix}layer.{k}.attention", module, occ))
        self._calls: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._handles: list[Any] = []
        self.outputs: dict[str, torch.Tensor] = {}

    def __enter__(self) -> "ValueRecorder":
        for module in {id(m): m for _, m, _ in self._blocks}.values():
            self._handles.append(module.register_forward_hook(self._hook))
        return self

    def _hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        self._calls[id(module)].append(output.detach())

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for name, module, occ in self._blocks:
            calls = self._calls[id(module)]
            if occ < len(calls):
                self.outputs[name] = calls[occ]
        self._calls.clear()


def head_outputs(V: torch.Tensor, out_proj: nn.Module | None, n_heads: int, head_dim: int,
                 point: str) -> torch.Tensor:
    """Each head's value vectors after its slice of the output projection, ``u_j = W_O^h v_j``
    (bias left out), float64 ``(B, n_heads, N, d)``, from the value projection's output
    ``V`` ``(B, N, n_kv * head_dim)``.

    Raises
    ------
    ModelError
        No known output projection (a generic layout other than GPT-NeoX, OPT, Phi and DistilBERT).
    """
    if out_proj is None:
        raise ModelError(f"{point}: no self-attention output projection the toolkit knows; "
                         "sink_contribution needs it")
    M = linear_map(out_proj, n_heads * head_dim).to(V.device)  # (H * d_head, d)
    Vh = head_values(V.double(), n_heads, head_dim)  # (B, H, N, d_head)
    return torch.einsum("bhnk,hkd->bhnd", Vh, M.reshape(n_heads, head_dim, -1))


def zeroed_heads(names: Sequence[str], edits: Mapping[str, Any] | None, ablation: Any,
                 loaded: Any) -> dict[str, list[int]]:
    """The self-attention heads a zero ablation removes
    (:class:`~rankcollapse.models.edits.HeadAblation` of ``loaded``), by attention point
    ``{prefix}layer.k.attention``: :func:`sink_values` gives them no contribution and
    leaves them out of the layer output ``y_i``.

    Raises
    ------
    ConfigError
        ``sink_contribution`` among ``names`` with a mean ablation or an edit at a
        ``layer.k.heads`` point: those heads' outputs are then no attention-weighted sum
        of value vectors, which is what the contribution weights decompose.
    """
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
                stack_list: list[Stack], config: Any, padding_of: Callable[[str], torch.Tensor],
                names: tuple[str, ...], zeroed: Mapping[str, Sequence[int]] | None = None,
                ) -> dict[tuple[str, str], torch.Tensor]:
    """Per-window sink metrics ``(B,)`` keyed by ``(point, metric)``: per head at
    ``{point}.head_h`` and per block at ``{point}`` = ``{prefix}layer.k.attention``;
    ``padding_of(point)`` is the ``(B, N)`` padding mask of that point's tokens.

    ``zeroed`` (:func:`zeroed_heads`): attention point -> heads whose output a zero
    ablation removes; their ``u^h_j`` are 0 in ``sink_contribution`` (contribution 0,
    and left out of the layer output), while ``sink_mass`` and ``sink_value_ratio``
    still read their attention and values, which the ablation does not change."""
    parts = {f"{s.prefix}layer.{k}.attention": p for s in stack_list for k, p in enumerate(s.blocks)}
    out: dict[tuple[str, str], torch.Tensor] = {}
    for point, A in attention_maps.items():
        pad = padding_of(point).to(A.device)
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
        for metric in ("sink_mass", "sink_value_ratio", "sink_contribution"):
            if metric in names:
                for h in range(n_heads):
                    out[(f"{point}.head_{h}", metric)] = per_head[metric][:, h]
                # contribution: the first token's share of the block's output, summed over heads
                whole = per_head[metric].sum(dim=1) if metric == "sink_contribution" else per_head[metric].mean(dim=1)
                out[(point, metric)] = whole
        if "sink_head_fraction" in names:
            out[(point, "sink_head_fraction")] = (mass >= SINK_THRESHOLD).double().mean(dim=1)
    return out
