"""Online softmax: softmax over a row that arrives a tile at a time.

Chapter 04's algorithm, the heart of FlashAttention.  A row of scores s is
seen a block at a time; we keep three running quantities per row

    m  the largest score seen so far                       (rows,)
    l  sum_j exp(s_j - m) over the scores seen so far       (rows,)
    O  sum_j exp(s_j - m) v_j, the unnormalised output      (rows, Dv)

When a new block raises the max from m to m_new, everything summed so far was
measured against the old max, so it is rescaled by alpha = exp(m - m_new) <= 1.
At the end out = O / l and lse = m + log(l).

Two partial results over disjoint sets of keys merge the same way, in either
of two forms:

    (m, l, O)   unnormalised, what a kernel holds in registers;
    (out, lse)  normalised, what a kernel writes to memory.

The merge is associative and commutative, so keys can be split any way and the
pieces combined in any order: split-KV decoding and multi-device attention
(later chapters) are this merge.

Shapes: m, l and lse are (..., rows); O and out are (..., rows, Dv).  Rows that
have seen no key carry m = -inf, l = 0, O = 0 (lse = -inf, out = 0), and every
function here keeps them that way without a NaN: exp(-inf - (-inf)) is never
evaluated.
"""
from __future__ import annotations

import numpy as np

from .reference import nan_lse_where_out_is_nan, safe_max  # safe_max: -inf -> 0, harmless when nothing was seen

# -- the steps of chapter 04, on one row or a stack of rows -------------------------

def safe_softmax(s, axis=-1):
    """softmax(s) = exp(s - max s) / sum exp(s - max s); a row of all -inf gives 0."""
    s = np.asarray(s)
    m = safe_max(np.max(s, axis=axis, keepdims=True))
    p = np.exp(s - m)
    l = np.sum(p, axis=axis, keepdims=True)
    return p / np.where(l == 0, 1, l)


def running_max_sum(s, block):
    """One pass over s in blocks of ``block``: the final (m, l) of the rows of s.

    m = max_j s_j and l = sum_j exp(s_j - m), computed without seeing the row
    twice: each block updates m and rescales the l summed so far.
    """
    s = np.asarray(s)
    m = np.full(s.shape[:-1], -np.inf, dtype=s.dtype)
    l = np.zeros(s.shape[:-1], dtype=s.dtype)
    for start in range(0, s.shape[-1], block):
        m, l = update_max_sum(m, l, s[..., start:start + block])
    return m, l


def update_max_sum(m, l, s_block):
    """Fold one block of scores (..., rows, Bc) into (m, l)."""
    m_new = np.maximum(m, np.max(s_block, axis=-1, initial=-np.inf))
    shift = safe_max(m_new)
    alpha = np.exp(m - shift)  # rescales the old sum; 0 when m was -inf
    l_new = alpha * l + np.sum(np.exp(s_block - shift[..., None]), axis=-1)
    return m_new, l_new


# -- the running state of attention: (m, l, O) -------------------------------------

def init_state(rows_shape, head_dim_v, dtype=np.float64):
    """(m, l, O) before any key: m = -inf, l = 0, O = 0."""
    rows_shape = (rows_shape,) if np.ndim(rows_shape) == 0 else tuple(rows_shape)
    m = np.full(rows_shape, -np.inf, dtype=dtype)
    l = np.zeros(rows_shape, dtype=dtype)
    o = np.zeros(rows_shape + (head_dim_v,), dtype=dtype)
    return m, l, o


def online_update(m, l, o, s_block, v_block, p_dtype=None):
    """Fold one tile of scores and values into the running (m, l, O).

    s_block: (..., rows, Bc) scores, -inf where hidden; v_block: (..., Bc, Dv).
    ``p_dtype`` rounds P to a low-precision dtype before P V, the way a GPU
    kernel feeds its matrix unit; l is summed from the unrounded P.
    Returns (m_new, l_new, O_new) and the tile's P (..., rows, Bc).
    """
    m_new = np.maximum(m, np.max(s_block, axis=-1, initial=-np.inf))
    shift = safe_max(m_new)            # a row that has seen nothing stays at m = -inf
    alpha = np.exp(m - shift)           # (..., rows): how far the old max was too small
    p = np.exp(s_block - shift[..., None])   # (..., rows, Bc), each <= 1
    l_new = alpha * l + np.sum(p, axis=-1)
    pv_in = p if p_dtype is None else p.astype(p_dtype).astype(p.dtype)
    o_new = alpha[..., None] * o + pv_in @ v_block.astype(p.dtype, copy=False)
    return m_new, l_new, o_new, p


def finalize_out(l, o):
    """out = O / l: the normalised output; 0 for a row that saw no key (l == 0)."""
    return o / np.where(l > 0, l, 1)[..., None]


def finalize_lse(m, l):
    """lse = m + log l, in l's dtype; -inf for a row that saw no key (l == 0)."""
    seen = l > 0
    with np.errstate(divide="ignore"):
        lse = np.where(seen, safe_max(m) + np.log(np.where(seen, l, 1)), -np.inf)
    return lse.astype(np.result_type(l), copy=False)


def finalize(m, l, o):
    """(out, lse) from the running state: out = O / l, lse = m + log l.

    ``rules.finalize`` on arrays, held equal to it by tests: a row that saw no
    key (l == 0) gives out = 0 and lse = -inf; a row whose output is NaN gets
    lse = NaN (``reference.nan_lse_where_out_is_nan``).  A kernel that needs
    only one half (FA1 divides by l after every step) calls that half.
    """
    out = finalize_out(l, o)
    return out, nan_lse_where_out_is_nan(out, finalize_lse(m, l))


def to_state(out, lse):
    """(m, l, O) from a normalised partial (out, lse): m = lse, l = 1, O = out."""
    lse = np.asarray(lse)
    l = np.where(np.isneginf(lse), 0.0, 1.0).astype(lse.dtype)
    return lse, l, np.asarray(out) * l[..., None]


# -- merging partial results ------------------------------------------------------

def merge(m1, l1, o1, m2, l2, o2):
    """Merge two running states over disjoint keys into the state over both.

    Each side is rescaled from its own max to the common one:
        m = max(m1, m2),  l = e^(m1-m) l1 + e^(m2-m) l2,  O = e^(m1-m) O1 + e^(m2-m) O2.
    Associative and commutative; a side that saw nothing (m = -inf) adds nothing.
    """
    m = np.maximum(m1, m2)
    shift = safe_max(m)
    a1, a2 = np.exp(m1 - shift), np.exp(m2 - shift)
    return m, a1 * l1 + a2 * l2, a1[..., None] * o1 + a2[..., None] * o2


def logaddexp(a, b):
    """log(e^a + e^b) without overflow, and -inf when both are -inf."""
    hi = np.maximum(a, b)
    lo = np.minimum(a, b)
    shift = safe_max(hi)
    return np.where(np.isneginf(hi), -np.inf, shift + np.log1p(np.exp(lo - shift)))


def merge_lse(out1, lse1, out2, lse2):
    """Merge two normalised partials (out, lse) over disjoint keys.

        lse = log(e^lse1 + e^lse2),  out = e^(lse1 - lse) out1 + e^(lse2 - lse) out2

    The weights are each side's share of the total softmax mass; they sum to 1.
    A side with lse = -inf has weight 0; both -inf gives out = 0, lse = -inf.
    """
    lse = logaddexp(lse1, lse2)
    shift = safe_max(lse)
    w1, w2 = np.exp(lse1 - shift), np.exp(lse2 - shift)
    return w1[..., None] * out1 + w2[..., None] * out2, lse


def merge_all(outs, lses):
    """Merge a list of normalised partials (split-KV's final reduction)."""
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"need as many outs as lses, at least one; got {len(outs)} and {len(lses)}")
    out, lse = outs[0], lses[0]
    for o, s in zip(outs[1:], lses[1:]):
        out, lse = merge_lse(out, lse, o, s)
    return out, lse
