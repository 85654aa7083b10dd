"""Reference attention: materialise S, softmax it, multiply by V.

This is chapter 01's algorithm written once, for every semantic the course
uses.  In float64 it is the ground truth every kernel is checked against
(impl ``reference``); run in the input dtype it is impl ``naive``, the
baseline whose rounding error sets the tolerance for low precision.

    S = scale * Q K^T          (B, H, Nq, Nk)   -- the N^2 matrix FlashAttention never writes
    S = softcap * tanh(S / softcap)              (optional)
    S = S - slope * |i + offset - j|             (optional ALiBi)
    S = -inf where the mask hides key j from query i
    P = softmax(S) row by row;  O = P V;  lse = log sum_j exp(S_ij)

ALiBi's bias is computed rebased, as every kernel computes it: from each row's
anchor, the key nearest its diagonal (``rules.alibi_rebased_distance``).  The
scores of row i then all sit slope * |i + offset - anchor_i| above S's
(``alibi_row_shift``): softmax, and so P and O, are the same, and lse takes
the constant back (``lse_of_rebased``).  Far from the diagonal (many more
queries than keys) the bias grows with the distance while the rebased one
stays small, so float32 keeps its digits where it would round a bias of
hundreds.
"""
from __future__ import annotations

import numpy as np

from . import rules
from .masks import MaskSpec, apply_softcap


def kv_head_index(heads: int, heads_k: int) -> np.ndarray:
    """For each query head, the K/V head it reads (GQA / MQA): h // (H / Hk)."""
    return np.arange(heads) // (heads // heads_k)


def dequantize(x, descale, dtype):
    """Float8 values x (B, Hx, N, D) times their descale (B, Hk), in ``dtype``: the real values.

    x is q (Hx = H, each query head taking its K / V head's descale, as FA3's
    (batch, heads_k) shape has it) or k / v (Hx = Hk).  ``descale`` None: x in ``dtype``.
    """
    x = x.astype(dtype)
    if descale is None:
        return x
    per_head = descale[:, kv_head_index(x.shape[1], descale.shape[1])]  # (B, Hx)
    return x * per_head[:, :, None, None].astype(dtype)


def dequantized(q, k, v, opts, dtype):
    """(q, k, v) in ``dtype``, times their descales when the call has them (float8 inputs)."""
    if opts.descale is None:
        return q, k, v
    return tuple(dequantize(x, d, dtype) for x, d in zip((q, k, v), opts.descale))


def alibi_row_shift(opts, mask: MaskSpec, rows=None):
    """How far rebased ALiBi lifts each row's scores: slope * ``mask.alibi_row_distance(rows)``,
    float64 (B, H, len(rows)) (every row when ``rows`` is None); None without ALiBi."""
    if opts.alibi_slopes is None:
        return None
    rows = np.arange(mask.seqlen_q) if rows is None else rows
    return opts.alibi_slopes[:, :, None] * mask.alibi_row_distance(rows).astype(np.float64)


def lse_of_rebased(lse, opts, mask: MaskSpec, rows=None):
    """The lse of the scores from that of the rebased scores a kernel summed: each row's shift taken
    back (in float64, rounded once to lse's dtype).  lse: (B, H, len(rows)); -inf and NaN stay."""
    shift = alibi_row_shift(opts, mask, rows)
    if shift is None:
        return lse
    return (lse.astype(np.float64) - shift).astype(lse.dtype)


def rebased_lse(lse, opts, mask: MaskSpec, rows=None):
    """A forward's lse as the rebased scores' (what a backward subtracts from them to get P): each row's
    shift added, in float64, rounded once to lse's dtype.  lse: (B, H, len(rows))."""
    shift = alibi_row_shift(opts, mask, rows)
    if shift is None:
        return lse
    return (lse.astype(np.float64) + shift).astype(lse.dtype)


def tile_scores(Qi, Kj, opts, mask: MaskSpec, rows, cols, acc_dtype, *, masked=True, round_dtype=None):
    """Scores of query ``rows`` against key ``cols``, ALiBi rebased: (B, H, len(rows), len(cols)) in ``acc_dtype``.

    Scale, softcap, ALiBi, then -inf where the mask hides a key: the steps in
    the order every impl takes them, for all of S (the reference) or for one
    tile (the tiled kernels, which pass ``masked=False`` for a tile the mask
    leaves full).  With ALiBi each row is S's row plus its ``alibi_row_shift``.
    Kj must already hold each query head's K/V head.
    ``round_dtype`` rounds Q K^T the way a float16 / bfloat16 matmul stores it.
    """
    acc = np.dtype(acc_dtype)
    s = np.matmul(Qi.astype(acc), np.swapaxes(Kj.astype(acc), -1, -2))
    if round_dtype is not None:
        s = s.astype(round_dtype).astype(acc)
    s = s * acc.type(opts.softmax_scale)
    if opts.softcap > 0:
        s = apply_softcap(s, acc.type(opts.softcap))
    if opts.alibi_slopes is not None:
        distance = mask.alibi_rebased_distance(rows, cols)  # |anchor_i - j|, (rows, cols)
        s = s - (opts.alibi_slopes[:, :, None, None] * distance).astype(acc)  # slopes (B, H)
    if masked:
        s = np.where(mask.visible(rows, cols), s, acc.type(-np.inf))
    return s


def rebased_scores(q, k, opts, mask: MaskSpec, compute_dtype, round_dtype=None):
    """Masked scores (B, H, Nq, Nk) in compute_dtype, ALiBi rebased (``tile_scores``); -inf where hidden."""
    k = k[:, kv_head_index(q.shape[1], k.shape[1])]  # (B, H, Nk, D): each query head's K
    rows, cols = np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)
    return tile_scores(q, k, opts, mask, rows, cols, compute_dtype,
                       masked=not mask.is_trivial, round_dtype=round_dtype)


def attention_scores(q, k, opts, mask: MaskSpec, compute_dtype):
    """Masked scores S (B, H, Nq, Nk) in compute_dtype, ALiBi's bias whole; -inf where hidden."""
    s = rebased_scores(q, k, opts, mask, compute_dtype)
    shift = alibi_row_shift(opts, mask)
    return s if shift is None else s - shift[..., None].astype(compute_dtype)


def safe_max(m):
    """The row max to subtract, with -inf (a row that saw no key) replaced by 0,
    so that exp(s - m) gives 0 there instead of exp(-inf + inf) = NaN."""
    return np.where(np.isneginf(m), 0, m).astype(np.result_type(m), copy=False)


def masked_softmax(s):
    """Row softmax of masked scores, safe for rows that see no key.

    Returns P (same shape) and lse (natural log).  A row whose scores are all
    -inf gets P = 0 and lse = -inf instead of 0/0 = NaN.
    """
    m_safe = safe_max(np.max(s, axis=-1, keepdims=True))  # subtracting the row max keeps exp <= 1
    p = np.exp(s - m_safe)
    l = np.sum(p, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (m_safe + np.log(l))[..., 0]
    p = p / np.where(l == 0, 1, l)
    return p, lse


def nan_lse_where_out_is_nan(out, lse):
    """The NaN rule: a row whose output holds a NaN gets lse = NaN, never -inf or a finite value.

    A NaN in V reaches rows that cannot see its key through 0 * NaN in P V
    (which rows depends on the impl and its tiles), while lse comes from the
    scores alone; without this rule such a row would say "no key seen" (-inf)
    or look healthy.  out: (..., rows, Dv); lse: (..., rows).
    """
    return np.where(np.isnan(out).any(axis=-1), np.nan, lse).astype(np.result_type(lse), copy=False)


def attention_math(q, k, v, opts, mask: MaskSpec, compute_dtype=np.float64, round_dtype=None):
    """O and lse for validated dense inputs, computed in ``compute_dtype``.

    ``round_dtype`` float16 / bfloat16 rounds S and the normalised P as a
    framework stores them.  float8 (FA3's recipe) leaves S alone and rounds the
    unnormalised P = exp(S - rowmax), whose largest entry is 1, before P V;
    l sums the unrounded P.  Float8 inputs are dequantised first (their descales).
    """
    q, k, v = dequantized(q, k, v, opts, compute_dtype)
    fp8 = rules.is_fp8(round_dtype)
    s = rebased_scores(q, k, opts, mask, compute_dtype, None if fp8 else round_dtype)
    v = v[:, kv_head_index(q.shape[1], v.shape[1])].astype(compute_dtype)  # (B, H, Nk, Dv)
    if fp8:
        m = safe_max(np.max(s, axis=-1, keepdims=True))
        p = np.exp(s - m)
        l = np.sum(p, axis=-1, keepdims=True)
        p8 = p.astype(round_dtype).astype(compute_dtype)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.matmul(p8, v) / np.where(l == 0, 1, l)
            lse = (m + np.log(l))[..., 0]
        return out, nan_lse_where_out_is_nan(out, lse_of_rebased(lse, opts, mask))
    p, lse = masked_softmax(s)
    if round_dtype is not None:
        p = p.astype(round_dtype).astype(compute_dtype)
    out = np.matmul(p, v)
    return out, nan_lse_where_out_is_nan(out, lse_of_rebased(lse, opts, mask))


def attention_forward(q, k, v, opts, mask: MaskSpec):
    """impl ``reference``: float64 throughout, result cast to the input dtype."""
    out, lse = attention_math(q, k, v, opts, mask, np.float64)
    return out.astype(rules.out_dtype(q.dtype)), lse.astype(rules.lse_dtype(q.dtype))
