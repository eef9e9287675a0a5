"""Masked softmax attention (spec.md §1), the reference dense path.

``A = softmax_G(X W_Q (X W_K)^T / sqrt(d_qk))`` with ``A[i, j] = 0`` where
``mask[i, j]`` is False. Rows of ``A`` sum to 1 and allowed entries are > 0.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref

import torch
import torch.nn.functional as F

from .chunks import rows_matmul
from ..errors import ConfigError, MaskError
from ..masks.rows import check_rows_allow_key


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row softmax of ``scores`` ``(..., N, N)`` restricted to ``mask`` (bool, broadcastable;
    True = i attends to j); masked entries are exactly 0, huge logits stay stable. Raises
    ``MaskError``: if some row has no allowed key (names the first such rows) or the mask does
    not broadcast to the scores."""
    if mask.shape != scores.shape and (mask.dim() > scores.dim() or any(  # (torch.broadcast_shapes: 30 µs)
            m not in (1, n) for m, n in zip(reversed(mask.shape), reversed(scores.shape)))):
        raise MaskError(f"a mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {tuple(scores.shape)}")
    info = torch.finfo(scores.dtype)
    # overflowed (+-inf) logits clamped: max-subtraction never forms inf - inf
    s = scores.clamp(info.min, info.max)
    every, keep, log_keep = _mask_forms(mask, scores.dtype)  # keep: 1 = allowed, 0 = masked; its log
    if mask.shape[-1] and every:  # every key allowed
        e = torch.exp(s - s.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)
    top = (s + log_keep).amax(dim=-1, keepdim=True)  # the largest allowed score (masked: -inf)
    if not math.isfinite(float(top.detach().sum())):  # a row without a key (-inf) or a NaN score (or a sum past the range)
        check_rows_allow_key(mask)
        top = s.masked_fill(~mask, info.min).amax(dim=-1, keepdim=True)  # NaN only from an allowed score
        s.masked_fill_(~mask, 0.0)
    else:
        s.mul_(keep)
    # exp of the masked entries is taken at 0 and multiplied by 0 (float arithmetic, no bool
    # mask pass): exp near the bottom of the range takes a slow path that costs ten times the rest
    e = torch.exp(s.sub_(top).mul_(keep)) * keep
    return e / e.sum(dim=-1, keepdim=True)


#: masks of at most this many entries keep their float forms for the next call (the layers of a
#: run pass one mask: its conversion and log(0) cost a small layer's softmax a sixth of its time)
MASK_FORMS_MAX = 2**16
_MASK_FORMS: dict[tuple, tuple] = {}


def _mask_forms(mask: torch.Tensor, dtype: torch.dtype) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """``(every key allowed, mask as 0/1 in dtype, its log)``; kept for a small mask while it lives
    and is not changed in place (its version counter), else computed."""
    small = mask.numel() <= MASK_FORMS_MAX and not mask.is_inference()
    key = (id(mask), dtype)
    hit = _MASK_FORMS.get(key) if small else None
    if hit is not None and hit[0]() is mask and hit[1] == mask._version:
        return hit[2]
    keep = mask.to(dtype)
    forms = (bool(mask.all()) if mask.numel() else True, keep, keep.log())
    if small:
        _MASK_FORMS[key] = (weakref.ref(mask, lambda _: _MASK_FORMS.pop(key, None)), mask._version, forms)
    return forms


def attention_weights(X: torch.Tensor, mask: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor, *,
                      d_qk: float) -> torch.Tensor:
    """Single-head attention ``(N, N)`` or ``(B, N, N)`` of tokens ``X`` ``(N, d)`` or ``(B, N, d)``,
    ``W_Q, W_K`` ``(d, d_k)``, mask bool ``(N, N)``, temperature ``d_qk > 0`` (spec.md §1)."""
    if not d_qk > 0:
        raise ConfigError(f"d_qk must be > 0, got {d_qk}")
    Q = X @ W_Q
    K = X @ W_K
    scores = Q @ K.transpose(-1, -2) / math.sqrt(d_qk)
    return masked_softmax(scores, mask)


def rotate_half_rope(x: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """RoPE (Su et al. 2021, eq. 34) in Llama's rotate-half layout: ``x cos + rotate_half(x) sin``,
    angles ``pos * inv_freq``; x ``(B, H, N, d_k)``, inv_freq ``(d_k/2,)``, positions ``0..N-1``."""
    n = x.shape[-2]
    pos = torch.arange(n, device=x.device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq.to(device=x.device, dtype=torch.float32)[None, :]  # (N, d_k/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _heads(Y: torch.Tensor, n_heads: int) -> torch.Tensor:
    B, N, width = Y.shape
    return Y.view(B, N, n_heads, width // n_heads).transpose(1, 2)  # (B, H, N, d_head)


def project_qkv(X: torch.Tensor, lw, *, uniform: bool = False, scratch: dict | None = None, split_qk: bool = False):
    """Queries, keys, values ``(B, H, N, d_k|d_v)`` of :class:`LayerWeights` ``lw``, with RoPE
    and grouped KV heads repeated to ``H``; ``uniform`` zeroes queries and keys.

    With ``lw.W_MV = [W_Q W_K^T | W_V]`` the queries are ``X W_Q W_K^T`` and the keys ``X``
    (same scores, one projection fewer); ``split_qk`` asks for the unfused ``X W_Q, X W_K``
    (differential attention splits them). ``scratch``: the caller's dict of kept arrays
    (:func:`kept`); the results are then views valid until its next use."""
    H = lw.n_heads
    H_kv = lw.n_kv_heads or H
    if lw.W_MV is not None and not uniform and not split_qk:  # scores X (W_Q W_K^T) X^T: keys are X itself
        Q, V = _fused(X, lw.W_MV, scratch).split((X.shape[-1], lw.W_V.shape[1]), dim=-1)
        return Q.unsqueeze(1), X.unsqueeze(1), V.unsqueeze(1)
    if lw.W_QKV is not None and not uniform:  # one fused (d, 3d) matmul instead of three
        Q, K, V = (_heads(Y, H) for Y in _fused(X, lw.W_QKV, scratch).split(lw.W_Q.shape[1], dim=-1))
        return Q, K, V
    V = _heads(_affine(X, lw.W_V, lw.b_V), H_kv)
    if uniform:
        d_k = lw.W_Q.shape[1] // H
        Q = X.new_zeros(X.shape[0], H, X.shape[1], d_k)
        K = X.new_zeros(X.shape[0], H_kv, X.shape[1], d_k)
    else:
        Q = _heads(_affine(X, lw.W_Q, lw.b_Q), H)
        K = _heads(_affine(X, lw.W_K, lw.b_K), H_kv)
        if lw.rope_inv_freq is not None:
            Q = rotate_half_rope(Q, lw.rope_inv_freq, lw.rope_scaling)
            K = rotate_half_rope(K, lw.rope_inv_freq, lw.rope_scaling)
    if H_kv != H:  # grouped-query attention: each KV head serves H / H_kv query heads
        K = K.repeat_interleave(H // H_kv, dim=1)
        V = V.repeat_interleave(H // H_kv, dim=1)
    return Q, K, V


def kept(scratch: dict | None, name: str, shape, dtype: torch.dtype, device) -> torch.Tensor | None:
    """A ``shape`` tensor carved from the buffer ``name`` of ``scratch``, reused by every layer
    while large enough (fresh pages cost a fault each); None without a dict or under
    autograd. Arrays never alive together share a name (``"tokens"``)."""
    if scratch is None or torch.is_grad_enabled():
        return None
    numel = math.prod(shape)
    t = scratch.get(name)
    with torch.inference_mode(False):
        if t is None or t.numel() < numel or t.dtype != dtype or t.device != torch.device(device):
            t = scratch[name] = torch.empty(numel, dtype=dtype, device=device)
        return t[:numel].view(shape)


def _fused(X: torch.Tensor, W: torch.Tensor, scratch: dict | None) -> torch.Tensor:
    """``X W``, into the kept tensor ``scratch["tokens"]`` if given."""
    out = kept(scratch, "tokens", (*X.shape[:-1], W.shape[1]), X.dtype, X.device)
    return rows_matmul(X, W, out)


def _affine(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return X @ W if b is None else torch.addmm(b, X.reshape(-1, X.shape[-1]), W).view(*X.shape[:-1], -1)


def merge_heads(O: torch.Tensor, lw, head_eps: float | None = None) -> torch.Tensor:
    """``(B, H, N, d_v)`` head outputs -> ``(B, N, H d_v)``, then ``W_O`` (+ ``b_O``) if set;
    ``head_eps``: each head's rows first divided by their RMS (head-wise RMSNorm, no gain)."""
    B, H, N, d_v = O.shape
    if head_eps is not None:
        O = F.rms_norm(O, (d_v,), eps=head_eps)
    Y = O.transpose(1, 2).reshape(B, N, H * d_v)
    return Y if lw.W_O is None else _affine(Y, lw.W_O, lw.b_O)


def scores_may_overflow(Q: torch.Tensor, K: torch.Tensor, scale: float,
                        bias: torch.Tensor | None = None) -> bool:
    """Whether some score ``scale * q . k (+ bias)`` may leave ``Q.dtype``'s finite range
    (``|q . k| <= d_k max|q| max|k|``, one host sync; NaN counts as overflow).

    ``F.scaled_dot_product_attention`` returns finite zeros on CPU for ``+inf`` logits, so a
    finiteness check of its output cannot catch overflow: it must be ruled out before.
    """
    parts = (Q, K) if bias is None else (Q, K, bias)
    ends = [e for x in parts for e in (x.amin(), x.amax())]  # faster than aminmax on strided views
    q_lo, q_hi, k_lo, k_hi, *b = torch.stack(ends).to(torch.float64).tolist()
    bound = abs(scale) * Q.shape[-1] * max(-q_lo, q_hi) * max(-k_lo, k_hi) + max([0.0, *(abs(v) for v in b)])
    return not bound < torch.finfo(Q.dtype).max / 16


def safe_softmax_scores(Q, K, mask: torch.Tensor, *, scale: float, bias: torch.Tensor | None = None,
                        overflow: bool | None = None):
    """Masked attention ``(B, H, Nq, Nk)`` in ``Q.dtype``; scores that may overflow
    (:func:`scores_may_overflow`, computed when ``overflow`` is None) are formed in float64."""
    if overflow is None:
        overflow = scores_may_overflow(Q, K, scale, bias)
    work = torch.float64 if overflow else Q.dtype
    scores = (Q.to(work) @ K.to(work).transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(work)
    return masked_softmax(scores, mask).to(Q.dtype)


_FLUSHED = (torch.float32, torch.float64, torch.bfloat16)  # tiny <= 1.2e-38: N tiny far below eps


def flush_subnormal(A: torch.Tensor) -> torch.Tensor:
    """Set attention weights below ``finfo.tiny`` to 0, in place, on the CPU; returns ``A``.

    Subnormal operands make CPU matmuls several times slower; dropping them changes each
    output by less than ``N_keys * tiny * max|v|``. Left alone: float16 (``tiny`` is not
    negligible there) and weights autograd needs. Callers reporting the weights or ε read
    them first."""
    if A.device.type == "cpu" and A.dtype in _FLUSHED and not A.requires_grad:
        torch.nn.functional.threshold_(A, _largest_subnormal(A.dtype), 0.0)
    return A


@contextlib.contextmanager
def denormals_are_zero():
    """Flush-to-zero and denormals-are-zero on the calling thread's CPU while inside
    (:func:`torch.set_flush_denormal`, a per-thread setting), the thread's own setting back
    on exit, also on an error. Yields whether the mode is on (False where the CPU has none:
    nothing changed).

    Inside, a float32/float64 result below ``finfo.tiny`` is 0 and such an operand reads as
    0: softmax weights come out as :func:`flush_subnormal` leaves them, without its pass, and
    the softmax takes no slow subnormal path. Weights read for ε or reports must be formed
    outside."""
    before = _denormals_flushed()
    on = torch.set_flush_denormal(True)
    try:
        yield on
    finally:
        if on and not before:
            torch.set_flush_denormal(False)


def _denormals_flushed() -> bool:
    """Whether the calling thread flushes subnormal float32 results to zero."""
    return bool(torch.tensor(torch.finfo(torch.float32).tiny, dtype=torch.float32) / 2 == 0)


@functools.cache
def denormals_flushable() -> bool:
    """Whether this CPU has :func:`denormals_are_zero`'s mode (probed once, on the calling
    thread, whose setting is kept)."""
    with denormals_are_zero() as on:
        return on


@functools.cache
def _largest_subnormal(dtype: torch.dtype) -> float:
    tiny = torch.tensor(torch.finfo(dtype).tiny, dtype=dtype)
    return float(torch.nextafter(tiny, torch.zeros_like(tiny)))


SMALL_SCORES = 16 * 2**20  # bytes of (B, H, N, N) scores below which CPU attention skips SDPA


def _small_attention(Q, K, V, mask: torch.Tensor, scale: float, scratch: dict | None = None) -> torch.Tensor:
    """Bounded scores by two batched matmuls and a softmax (on the CPU faster than SDPA), in kept buffers."""
    shape = (*Q.shape[:-1], K.shape[-2])  # (B, H, N, N)
    s_buf, a_buf = (kept(scratch, n, shape, Q.dtype, Q.device) for n in ("scores", "weights"))
    s = Q @ K.transpose(-1, -2) if s_buf is None else torch.matmul(Q, K.transpose(-1, -2), out=s_buf)
    if scale != 1.0:
        s.mul_(scale)
    s.masked_fill_(~mask, float("-inf"))  # every row has an allowed key (validated)
    A = torch.softmax(s, dim=-1) if a_buf is None else torch.ops.aten._softmax.out(s, -1, False, out=a_buf)
    return flush_subnormal(A) @ V


def dense_attention(Q, K, V, mask: torch.Tensor, *, scale: float, bias: torch.Tensor | None = None,
                    need_weights: bool = False, overflow: bool | None = None, scratch: dict | None = None):
    """Masked softmax attention on the full ``(N, N)`` score matrix.

    Q, K : ``(B, H, N, d_k)``; V : ``(B, H, N, d_v)``; mask bool ``(N, N)``; bias
    ``(H, N, N)`` added to the scaled scores (T5). Returns ``(out (B, H, N, d_v), A)``,
    ``A (B, H, N, N)`` only with ``need_weights``. Bounded scores without weights or bias go
    to ``F.scaled_dot_product_attention`` (on the CPU under :data:`SMALL_SCORES` bytes,
    :func:`_small_attention`), others to :func:`safe_softmax_scores`. ``overflow``: the
    caller's verdict of :func:`scores_may_overflow` (None = compute it).
    """
    if not need_weights and bias is None:
        if not (scores_may_overflow(Q, K, scale) if overflow is None else overflow):
            if Q.device.type == "cpu" and Q.shape[0] * Q.shape[1] * Q.shape[2] * K.shape[2] * Q.element_size() \
                    <= SMALL_SCORES:
                return _small_attention(Q, K, V, mask, scale, scratch), None
            return torch.nn.functional.scaled_dot_product_attention(Q, K, V, attn_mask=mask, scale=scale), None
    A = safe_softmax_scores(Q, K, mask, scale=scale, bias=bias, overflow=overflow)
    return A @ V, A
