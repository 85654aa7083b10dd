"""The backward pass of attention, materialising P: the float64 gradient every backward is checked on.

Given the forward's output O and its lse (natural log), and dO, the gradient
of the loss with respect to O, the chain rule through O = P V,
P = softmax(S) and S = scale Q K^T gives (FlashAttention-2, Algorithm 2):

    P  = exp(S - lse)                  recomputed from Q, K and lse: P is never stored
                                       (with ALiBi, rebased S less rebased lse: ``core.reference``)
    dV = P^T dO
    dP = dO V^T
    D  = rowsum(dO * O)                = rowsum(P * dP), one number per query row
    dS = P * (dP - D)                  the softmax's Jacobian applied to dP
    dQ = scale dS K,   dK = scale dS^T Q

Softcap multiplies dS by its slope, 1 - (t / cap)^2 where t is the capped
score (``rules.softcap_slope``); ALiBi and the mask are constants in S and have
no gradient of their own (a hidden pair has P = 0, so dS = 0 there).  A row
that sees no key (lse = -inf) has P = 0 and gets a zero gradient.  With GQA /
MQA a K / V head serves H / Hk query heads, so its dK and dV are the sums over
those heads (``sum_groups``).

The tile functions here (``tile_probabilities``, ``delta``, ``tile_dscores``)
are what the tiled backwards run on one tile; ``backward_math`` runs them on
the whole of S at once.  In float64 it is impl ``reference``; in the
accumulation dtype, with P and dS rounded to the input dtype before their
matmuls at float16 / bfloat16 (as FlashAttention feeds its matrix units), it is
``naive``, the same-dtype baseline of the gradient tolerance rule.
"""
from __future__ import annotations

import numpy as np

from . import rules
from .masks import MaskSpec
from .reference import kv_head_index, rebased_lse, safe_max, tile_scores


def tile_probabilities(Qi, Kj, lse_i, opts, mask: MaskSpec, rows, cols, acc_dtype, *, masked=True):
    """(Pij, slope) for query ``rows`` x key ``cols``: P recomputed from the scores and the stored lse.

    ``slope`` is softcap's derivative at each score (None without softcap), 0 where the mask hides
    the pair.  Kj must already hold each query head's K head.  lse_i: (B, H, len(rows)).
    """
    acc = np.dtype(acc_dtype)
    s = tile_scores(Qi, Kj, opts, mask, rows, cols, acc, masked=masked)   # ALiBi rebased: so is the lse
    shift = safe_max(rebased_lse(lse_i, opts, mask, rows).astype(acc))[..., None]   # no key seen: P = 0
    p = np.exp(s - shift)
    slope = None
    if opts.softcap > 0:
        t = s
        if opts.alibi_slopes is not None:               # t is the capped score, before ALiBi
            distance = mask.alibi_rebased_distance(rows, cols)
            t = s + (opts.alibi_slopes[:, :, None, None] * distance).astype(acc)
        with np.errstate(invalid="ignore"):
            slope = np.where(np.isfinite(s), rules.softcap_slope(t, acc.type(opts.softcap)), 0).astype(acc)
    return p, slope


def delta(dO, O, acc_dtype):
    """D_i = rowsum(dO_i * O_i): (..., rows), in the accumulation dtype."""
    acc = np.dtype(acc_dtype)
    return np.sum(dO.astype(acc) * O.astype(acc), axis=-1)


def tile_dscores(P, dP, D_i, slope):
    """dS = P * (dP - D), times softcap's slope where there is one."""
    dS = P * (dP - D_i[..., None])
    return dS if slope is None else dS * slope


def sum_groups(x, heads_k):
    """(B, H, N, D) per query head -> (B, Hk, N, D): each K / V head's gradient summed over its query heads."""
    B, H = x.shape[:2]
    return x.reshape(B, heads_k, H // heads_k, *x.shape[2:]).sum(axis=2)


def _rounded(x, round_dtype):
    return x if round_dtype is None else x.astype(round_dtype).astype(x.dtype)


def backward_math(q, k, v, out, lse, dout, opts, mask: MaskSpec, compute_dtype=np.float64, round_dtype=None):
    """(dq, dk, dv) in ``compute_dtype`` for validated dense inputs; P (B, H, Nq, Nk) materialised."""
    c = np.dtype(compute_dtype)
    H, Hk = q.shape[1], k.shape[1]
    kv = kv_head_index(H, Hk)
    Q, K, V = q.astype(c), k[:, kv].astype(c), v[:, kv].astype(c)   # K, V: (B, H, Nk, D) per query head
    dO = dout.astype(c)
    rows, cols = np.arange(mask.seqlen_q), np.arange(mask.seqlen_k)
    P, slope = tile_probabilities(Q, K, lse, opts, mask, rows, cols, c, masked=not mask.is_trivial)
    D = delta(dO, out, c)
    dV = np.matmul(np.swapaxes(_rounded(P, round_dtype), -1, -2), dO)
    dP = np.matmul(dO, np.swapaxes(V, -1, -2))
    dS = _rounded(tile_dscores(P, dP, D, slope), round_dtype)
    scale = c.type(opts.softmax_scale)
    dQ = scale * np.matmul(dS, K)
    dK = scale * np.matmul(np.swapaxes(dS, -1, -2), Q)
    return dQ, sum_groups(dK, Hk), sum_groups(dV, Hk)


def attention_backward(q, k, v, out, lse, dout, opts, mask: MaskSpec):
    """Backward impl ``reference``: float64 throughout, gradients cast to the input dtype."""
    grads = backward_math(q, k, v, out, lse, dout, opts, mask, np.float64)
    return tuple(g.astype(q.dtype) for g in grads)


def naive_backward(q, k, v, out, lse, dout, opts, mask: MaskSpec):
    """Backward impl ``naive``: the same math in the accumulation dtype, P and dS rounded at low precision."""
    grads = backward_math(q, k, v, out, lse, dout, opts, mask, rules.acc_dtype(q.dtype),
                          rules.p_round_dtype(q.dtype))
    return tuple(g.astype(q.dtype) for g in grads)
