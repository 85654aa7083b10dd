"""One rank's work on one K/V shard: partial (out, lse) for its queries, merged into what it holds.

This is the whole arithmetic of ring attention; ``ring`` adds only the moving
of shards between processes, and ``simulate_ring`` runs the same steps for all
ranks in one process (what the notebook steps through and the tests compare).

Each call is the course's own kernel, ``course_lib.attention(..., return_lse=True)``,
on the rows and keys of two pieces (``sharding``).  Under a causal mask, local
query i sees local key j iff j <= i + d, and the kernel must be given exactly
that mask.  It knows causal aligned bottom-right (j <= i + Nk - Nq) and windows
around that diagonal, so ``local_partial`` chooses the call:

    d + Nq - 1 < 0      no row sees any key: skip the call (out 0, lse -inf)
    d >= Nk - 1         every row sees every key: no mask at all
    d >= Nk - Nq        a window (-1, d - (Nk - Nq)) right of the bottom-right diagonal
    otherwise           keys past d + Nq are seen by no row: keep the first d + Nq
                        keys, and then bottom-right causal is j <= i + d exactly

The merge is chapter 04's ``merge_lse`` (``core.online_softmax``): the same
function that split-KV decoding uses.
"""
from __future__ import annotations

import numpy as np

from ..api import attention
from ..core.online_softmax import merge_lse
from ..core.rules import lse_dtype
from . import sharding
from .peer import sdpa_partial

PEER = "torch_sdpa"   # torch's own kernels, the peer a course impl is measured against


def mask_call(d: int, nq: int, nk: int, causal: bool):
    """How to ask the kernel for the mask j <= i + d on an (nq, nk) block.

    Returns None (nothing visible: skip), or (keys, options): use the first
    ``keys`` keys and call ``attention`` with ``options``.
    """
    if not causal or d >= nk - 1:
        return nk, {}
    if d + nq - 1 < 0:
        return None
    if d >= nk - nq:
        return nk, {"window_size": (-1, d - (nk - nq))}
    return d + nq, {"causal": True, "causal_align": "bottom_right"}


def empty_partial(q, head_dim_v):
    """(out, lse) of rows that have seen no key: the identity of the merge."""
    B, H, nq, _ = q.shape
    return (np.zeros((B, H, nq, head_dim_v), dtype=q.dtype),
            np.full((B, H, nq), -np.inf, dtype=lse_dtype(q.dtype)))


def local_partial(q, k, v, d, *, causal, impl="flash_numpy", softmax_scale=None):
    """Partial (out, lse) of q (B, H, nq, D) over k, v (B, Hk, nk, D[v]) with mask j <= i + d.

    ``impl`` is a course impl, or ``"torch_sdpa"`` for PyTorch's kernels (``peer``)."""
    call = mask_call(d, q.shape[2], k.shape[2], causal)
    if call is None:
        return empty_partial(q, v.shape[3])
    keys, options = call
    scale = 1.0 / np.sqrt(q.shape[3]) if softmax_scale is None else softmax_scale
    if impl == PEER:
        return sdpa_partial(q, k[:, :, :keys], v[:, :, :keys], options, scale)
    return attention(q, k[:, :, :keys], v[:, :, :keys], impl=impl, softmax_scale=scale,
                     return_lse=True, **options)


def piece_slices(pieces):
    """Where each piece's rows sit in the rank's local arrays."""
    starts = np.cumsum([0] + [p.length for p in pieces])
    return [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]


def attend_shard(state, q, q_pieces, k, v, k_pieces, *, causal, impl="flash_numpy", softmax_scale=None):
    """Fold one K/V shard into a rank's (out, lse): every (Q piece, K piece) pair, merged.

    ``q`` holds the rank's rows in the order of ``q_pieces``; ``k``, ``v`` the
    shard's keys in the order of ``k_pieces``.  Returns the new (out, lse).
    """
    out, lse = state
    out, lse = out.copy(), lse.copy()
    for qs, qp in zip(piece_slices(q_pieces), q_pieces):
        for ks, kp in zip(piece_slices(k_pieces), k_pieces):
            d = sharding.diagonal(qp, kp) if causal else 0
            part = local_partial(q[:, :, qs], k[:, :, ks], v[:, :, ks], d, causal=causal,
                                 impl=impl, softmax_scale=softmax_scale)
            out[:, :, qs], lse[:, :, qs] = merge_lse(out[:, :, qs], lse[:, :, qs], *part)
    return out, lse


def shard(x, pieces, axis=2):
    """The rows of x (along ``axis``, the sequence) that a rank with these pieces holds."""
    return np.take(x, sharding.positions(pieces), axis=axis)


def simulate_ring(q, k, v, world_size, *, scheme="contiguous", causal=False, impl="flash_numpy"):
    """Ring attention for every rank in one process: the steps ``ring`` runs, without a network.

    Returns the global (out, lse), reassembled from the ranks' rows.
    """
    layouts = sharding.layout(scheme, q.shape[2], world_size)
    states = [empty_partial(shard(q, layouts[r]), v.shape[3]) for r in range(world_size)]
    for step in range(world_size):
        for rank in range(world_size):
            src = sharding.ring_source(rank, step, world_size)
            states[rank] = attend_shard(states[rank], shard(q, layouts[rank]), layouts[rank],
                                        shard(k, layouts[src]), shard(v, layouts[src]), layouts[src],
                                        causal=causal, impl=impl)
    return unshard([s[0] for s in states], [s[1] for s in states], layouts)


def unshard(outs, lses, layouts):
    """The global (out, lse) from each rank's rows and the layout that dealt them."""
    pos = np.concatenate([sharding.positions(p) for p in layouts])
    order = np.argsort(pos)
    out = np.concatenate(outs, axis=2)[:, :, order]
    lse = np.concatenate(lses, axis=2)[:, :, order]
    return out, lse
